#include "epd/core/embedding.h"

#include <cstdint>
#include <cstring>
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

// Eight bytes at a time, as lanes of a uint64: per lane, (x & exponent) +
// the lowest exponent bit carries into the lane's top bit exactly when the
// exponent is all ones, and never into the next lane (the sum is at most the
// top bit). One AND, ADD and OR per word, which the compiler vectorizes; a
// trailing partial word is padded with zeros (finite).
bool ElementsFinite(DType d, const std::byte* p, std::size_t n) {
  struct Lanes {
    std::uint64_t exponent, low, top;
  };
  const Lanes l = d == DType::kFloat32    ? Lanes{0x7f8000007f800000u, 0x0080000000800000u, 0x8000000080000000u}
                  : d == DType::kBFloat16 ? Lanes{0x7f807f807f807f80u, 0x0080008000800080u, 0x8000800080008000u}
                                          : Lanes{0x7c007c007c007c00u, 0x0400040004000400u, 0x8000800080008000u};
  const std::size_t words = n / 8;
  std::uint64_t acc = 0;
  for (std::size_t i = 0; i < words; ++i) {
    std::uint64_t x;
    std::memcpy(&x, p + 8 * i, 8);
    acc |= (x & l.exponent) + l.low;
  }
  if (n % 8 != 0) {
    std::uint64_t x = 0;
    std::memcpy(&x, p + 8 * words, n % 8);
    acc |= (x & l.exponent) + l.low;
  }
  return (acc & l.top) == 0;
}

bool RowsFinite(const Embedding& e) {
  return ElementsFinite(e.dtype, e.main.data(), e.main.size()) &&
         ElementsFinite(e.dtype, e.deepstack.data(), e.deepstack.size());
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
