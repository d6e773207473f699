// epd/core/vision_tower.h: the vision-tower interface the encode worker drives.
//
// A VisionTower turns a batch of preprocessed items into post-merge
// embeddings. Inputs are packed patch rows (see epd/media/preprocess.h):
//   item i: patches [grid_i.patches(), patch_dim] float32, row-major,
//           patch_dim = 3 * temporal_patch * patch * patch = 3*2*14*14 = 1176.
// The output is one contiguous host buffer per half, rows concatenated in the
// batch's item order:
//   main       [sum_i tokens_i, hidden]                      dtype
//   deepstack  [sum_i tokens_i, hidden * deepstack_layers]   dtype (empty if 0)
// A backend must not assume the caller keeps the output: the worker copies
// each item's rows out, so the next Encode may reuse or free the buffer.
//
// Device output: a backend that runs on a GPU may leave its output in device
// memory instead (output_on_device() true; e.g. TorchTowerOptions::
// output_on_device). The host vectors are then empty and device_main /
// device_deepstack point at the same layouts in VRAM, kept alive by
// device_owner. The worker then copies each item's rows device -> device
// into its L1 entry (WorkerOptions::adopt_device_rows, supplied by the GPU
// tier), so a miss's embedding never round-trips through host memory.
//
// Errors: Encode returns a Status (never throws) for a failed forward, e.g.
// kInternal with the backend's message, or kInvalidArgument for inputs whose
// patch_dim does not match. The worker additionally checks that the row count
// equals the token sum and fails only that batch otherwise.
//
// Thread safety: thread-compatible. One worker thread calls Encode.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "epd/core/embedding.h"
#include "epd/core/grid.h"
#include "epd/core/status.h"

namespace epd {

// One item of a tower batch. Borrowed: `patches` must stay valid during Encode.
struct TowerItem {
  const float* patches = nullptr;  // [grid.patches(), patch_dim] float32
  GridTHW grid;
  // Floats per row of `patches` as the producer laid them out (e.g.
  // PreprocessedImage::patch_dim). A backend rejects a value other than its
  // own patch_dim() with kInvalidArgument; 0 means "the tower's own" and is
  // not checked.
  std::int64_t patch_dim = 0;
};

// The batch output. Owns its bytes.
// Its shape: `tokens` rows, the sum of post-merge tokens over the batch.
struct TowerOutput : EmbeddingShape {
  std::vector<std::byte> main;       // tokens * hidden * DTypeSize(dtype)
  std::vector<std::byte> deepstack;  // tokens * hidden * deepstack_layers * DTypeSize(dtype)

  // Device output (see the header comment); all null for host output. The
  // backend has finished writing the bytes (synchronised its stream) before
  // Encode returns. Layouts and sizes as main / deepstack above.
  const std::byte* device_main = nullptr;
  const std::byte* device_deepstack = nullptr;  // null when deepstack_layers == 0
  std::shared_ptr<const void> device_owner;     // keeps both alive (e.g. the tensors)

  bool on_device() const { return device_owner != nullptr; }
};

// One item's rows of a device-resident TowerOutput, as handed to
// WorkerOptions::adopt_device_rows. `main` / `deepstack` point into device
// memory: [tokens, hidden] and [tokens, hidden * deepstack_layers], dtype;
// valid while `owner` lives (the adopter holds it until its copy lands).
// `grid` is the item's patch grid; the adopted Embedding must carry it.
struct DeviceRows : EmbeddingShape {
  GridTHW grid;
  const std::byte* main = nullptr;
  const std::byte* deepstack = nullptr;
  std::shared_ptr<const void> owner;
};

class VisionTower {
 public:
  virtual ~VisionTower() = default;

  // Runs one forward over `items`. See the header comment for shapes.
  virtual StatusOr<TowerOutput> Encode(std::span<const TowerItem> items) = 0;

  virtual std::int64_t patch_dim() const = 0;   // 1176 for patch 14, temporal 2, RGB
  virtual std::int64_t merge_size() const = 0;  // 2
  virtual std::int64_t hidden() const = 0;
  virtual std::int64_t deepstack_layers() const = 0;
  virtual DType dtype() const = 0;
  // The shape the tower's output has for `tokens` rows (hidden(),
  // deepstack_layers(), dtype()).
  EmbeddingShape OutputShape(std::int64_t tokens) const {
    return EmbeddingShape{tokens, hidden(), deepstack_layers(), dtype()};
  }
  // True when Encode leaves its output in device memory (TowerOutput::
  // on_device()); such a tower needs a worker with a GPU tier.
  virtual bool output_on_device() const { return false; }
  // True when no patch of temporal slice t ever influences another slice's
  // rows: attention segments (full and windowed) stay within one frame pair,
  // positions depend on (h, w) only and the merger folds patches of one slice.
  // Then an item of grid (t, h, w) encodes to the concatenation of t items of
  // grid (1, h, w), one per temporal patch, and the worker may cache a video
  // per temporal chunk (docs/VIDEO.md). True for the Qwen2-VL, Qwen2.5-VL and
  // Qwen3-VL checkpoint towers; a TorchScript tower declares it with the
  // attribute `temporal_chunks_independent: bool = True` (docs/TOWER.md).
  // False (the default) makes the worker refuse video items.
  virtual bool temporal_chunks_independent() const { return false; }
  // A short human-readable description, e.g. "torchscript:/path/model.pt (cpu, 2 threads)".
  virtual std::string Describe() const = 0;
};

}  // namespace epd
