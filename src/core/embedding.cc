#include "epd/core/embedding.h"

#include <string>

namespace epd {

std::string_view DTypeName(DType d) {
  switch (d) {
    case DType::kFloat32:
      return "float32";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat16:
      return "float16";
  }
  return "unknown";
}

std::string_view DTypeSafetensorsName(DType d) {
  switch (d) {
    case DType::kFloat32:
      return "F32";
    case DType::kBFloat16:
      return "BF16";
    case DType::kFloat16:
      return "F16";
  }
  return "unknown";
}

StatusOr<EmbeddingPtr> ToHost(const EmbeddingPtr& e) {
  if (e == nullptr) return InvalidArgument("ToHost: null embedding");
  if (e->on_host()) return e;
  // A hand-built shape must not size the host vectors before CopyToHost can
  // check it.
  if (e->tokens < 0 || e->hidden < 0 || e->deepstack_layers < 0) {
    return InvalidArgument("ToHost: negative shape (tokens " + std::to_string(e->tokens) + ", hidden " +
                           std::to_string(e->hidden) + ", deepstack_layers " + std::to_string(e->deepstack_layers) +
                           ")");
  }
  auto out = std::make_shared<Embedding>();
  out->tokens = e->tokens;
  out->hidden = e->hidden;
  out->deepstack_layers = e->deepstack_layers;
  out->dtype = e->dtype;
  out->grid = e->grid;
  const std::size_t main_bytes = static_cast<std::size_t>(e->tokens * e->hidden) * DTypeSize(e->dtype);
  out->main.resize(main_bytes);
  out->deepstack.resize(e->ExpectedBytes() - main_bytes);
  if (Status st = e->resident->CopyToHost(out->main, out->deepstack); !st.ok()) return st;
  return EmbeddingPtr(std::move(out));
}

}  // namespace epd
