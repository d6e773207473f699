#include "epd/embedding.h"

namespace epd {

std::string_view DTypeName(DType d) {
  switch (d) {
    case DType::kFloat32: return "float32";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat16: return "float16";
  }
  return "unknown";
}

std::string_view DTypeSafetensorsName(DType d) {
  switch (d) {
    case DType::kFloat32: return "F32";
    case DType::kBFloat16: return "BF16";
    case DType::kFloat16: return "F16";
  }
  return "unknown";
}

}  // namespace epd
