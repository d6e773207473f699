// epd/core/embedding.h: one image's vision-tower output, as cached and shipped.
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
// Grid: `grid` is the item's (t, h, w) patch grid before the merger
// (epd/core/grid.h), which Qwen-VL prefill needs to build the item's M-RoPE
// positions; tokens == grid.tokens(merge_size). It travels with the bytes:
// the worker sets it from the preprocessed image, the cache tiers, gRPC,
// safetensors and the Python client carry it along. {0, 0, 0} means unknown
// (e.g. read from a file written before grids were recorded).
//
// Residency: by default the bytes are in the two host vectors. An embedding
// cached by the GPU tier (epd/gpu/device_tier.h) instead keeps them in device
// memory (L1) or pinned host memory (L2): `resident` is then set, `main` and
// `deepstack` are empty, and ToHost() gives a host copy. The encode worker
// delivers cached values as they are, so a consumer in the same process can
// use device-resident rows without a copy; code that reads the bytes on the
// host (gRPC shipping, safetensors) calls ToHost() first, which costs nothing
// for a host embedding. A resident embedding refers to its Device: drop it
// (and every copy of the Embedding sharing `resident`) before the Device,
// as epd/gpu/device.h requires of every buffer.
//
// Thread safety: immutable after construction; safe to share.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "epd/core/grid.h"
#include "epd/core/status.h"

namespace epd {

enum class DType : std::uint8_t { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

constexpr std::size_t DTypeSize(DType d) { return d == DType::kFloat32 ? 4 : 2; }
// "float32", "bfloat16", "float16".
std::string_view DTypeName(DType d);
// safetensors spelling: "F32", "BF16", "F16".
std::string_view DTypeSafetensorsName(DType d);

// An embedding's bytes held outside host vectors (implemented by the GPU
// tier's TierEmbedding). Same layout as Embedding: main rows, then deepstack
// rows, in one contiguous block.
class ResidentBytes {
 public:
  virtual ~ResidentBytes() = default;
  // "device" (VRAM) or "pinned_host".
  virtual std::string_view location() const = 0;
  // Copies main then deepstack into the two host ranges, whose sizes must be
  // the owning Embedding's main and deepstack byte counts; blocks until the
  // bytes have landed. kInvalidArgument for wrong sizes; kInternal for a
  // device failure.
  virtual Status CopyToHost(std::span<std::byte> main, std::span<std::byte> deepstack) const = 0;
  // For a consumer on the same device (e.g. a prefill engine in this
  // process), without a copy: Wait() blocks until the bytes are complete
  // (kInternal on a device failure), then data() is the block, main rows
  // then deepstack rows, in the memory location() names (a device pointer
  // for "device"). Valid while this object lives; read-only.
  virtual Status Wait() const = 0;
  virtual const std::byte* data() const = 0;
};

// An embedding's shape, without the bytes: the one declaration that
// Embedding, the tower's batch output (TowerOutput, epd/core/vision_tower.h), a
// device output's rows (DeviceRows) and the GPU tier's entries share.
struct EmbeddingShape {
  std::int64_t tokens = 0;            // post-merge tokens (rows)
  std::int64_t hidden = 0;            // columns of `main`
  std::int64_t deepstack_layers = 0;  // 0 when the tower has no deepstack outputs
  DType dtype = DType::kFloat32;

  // Bytes of main ([tokens, hidden]) and deepstack ([tokens, hidden *
  // deepstack_layers]) this shape takes, and their sum.
  std::size_t main_bytes() const { return static_cast<std::size_t>(tokens * hidden) * DTypeSize(dtype); }
  std::size_t deepstack_bytes() const { return main_bytes() * static_cast<std::size_t>(deepstack_layers); }
  std::size_t nbytes() const { return main_bytes() + deepstack_bytes(); }

  // The shape part of any of the types above (which derive from it).
  const EmbeddingShape& shape() const { return *this; }
  friend bool operator==(const EmbeddingShape&, const EmbeddingShape&) = default;
};

struct Embedding : EmbeddingShape {
  // Two embeddings compare by shape() (what the base's == would do
  // silently) or by bytes, never by a bare ==.
  bool operator==(const Embedding&) const = delete;

  // The item's patch grid (see Grid above); {0, 0, 0} when unknown. Not
  // counted in nbytes().
  GridTHW grid;
  std::vector<std::byte> main;       // tokens * hidden * DTypeSize(dtype) bytes
  std::vector<std::byte> deepstack;  // tokens * hidden * deepstack_layers * DTypeSize(dtype) bytes
  // Set when the bytes live in device or pinned memory (see Residency above);
  // main and deepstack are then empty.
  std::shared_ptr<const ResidentBytes> resident;

  bool on_host() const { return resident == nullptr; }
  // Exact bytes charged to the cache: main plus deepstack payload, wherever
  // it lives. (Hides EmbeddingShape::nbytes, which is ExpectedBytes.)
  std::size_t nbytes() const { return on_host() ? main.size() + deepstack.size() : ExpectedBytes(); }
  // What nbytes() must be for the declared shape; used to validate.
  std::size_t ExpectedBytes() const { return EmbeddingShape::nbytes(); }
};

using EmbeddingPtr = std::shared_ptr<const Embedding>;

// `e` itself when its bytes are on the host (no copy); otherwise a new host
// Embedding with the same shape and grid and a copy of the bytes (blocks until the
// copy lands). kInvalidArgument for a null `e` or a resident one with a
// negative shape; the ResidentBytes' errors otherwise. Cost: O(1) for a host
// embedding, one copy of nbytes() else.
StatusOr<EmbeddingPtr> ToHost(const EmbeddingPtr& e);

// True when none of the `n` bytes at `p`, read as elements of `dtype`, is a
// NaN or an infinity (an IEEE 754 binary32 or binary16 exponent, or
// bfloat16's, which is binary32's, with every bit set). A trailing partial
// element counts as finite. O(n), no allocation; thread-safe.
bool ElementsFinite(DType dtype, const std::byte* p, std::size_t n);
// ElementsFinite over main and deepstack. REQUIRES: e.on_host().
bool RowsFinite(const Embedding& e);

}  // namespace epd
