// epd/embedding.h: one image's vision-tower output, as cached and shipped.
//
// An Embedding owns its bytes. The worker copies each item's rows out of the
// tower's batch output into a fresh Embedding, so no cached value is ever a
// view into a buffer that the next batch overwrites. Once published behind an
// `EmbeddingPtr` (shared_ptr to const) it is immutable, and a reader holding
// the pointer keeps it alive after the cache evicts, replaces or pops it.
//
// Layout (row-major, little-endian):
//   main       [tokens, hidden]                      dtype
//   deepstack  [tokens, hidden * deepstack_layers]   dtype   (empty when 0 layers)
// Size in bytes: tokens * hidden * (1 + deepstack_layers) * DTypeSize(dtype).
// Example: 100 tokens, hidden 2048, 3 deepstack layers, bf16 ->
//   100 * 2048 * 4 * 2 = 1,638,400 bytes.
//
// Thread safety: immutable after construction; safe to share.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

namespace epd {

enum class DType : std::uint8_t { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

constexpr std::size_t DTypeSize(DType d) { return d == DType::kFloat32 ? 4 : 2; }
// "float32", "bfloat16", "float16".
std::string_view DTypeName(DType d);
// safetensors spelling: "F32", "BF16", "F16".
std::string_view DTypeSafetensorsName(DType d);

struct Embedding {
  std::int64_t tokens = 0;            // post-merge tokens (rows)
  std::int64_t hidden = 0;            // columns of `main`
  std::int64_t deepstack_layers = 0;  // 0 when the tower has no deepstack outputs
  DType dtype = DType::kFloat32;
  std::vector<std::byte> main;       // tokens * hidden * DTypeSize(dtype) bytes
  std::vector<std::byte> deepstack;  // tokens * hidden * deepstack_layers * DTypeSize(dtype) bytes

  // Exact bytes charged to the cache: main plus deepstack payload.
  std::size_t nbytes() const { return main.size() + deepstack.size(); }
  // What nbytes() must be for the declared shape; used to validate.
  std::size_t ExpectedBytes() const {
    return static_cast<std::size_t>(tokens * hidden * (1 + deepstack_layers)) * DTypeSize(dtype);
  }
};

using EmbeddingPtr = std::shared_ptr<const Embedding>;

}  // namespace epd
