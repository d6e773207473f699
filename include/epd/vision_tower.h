// epd/vision_tower.h: the vision-tower interface the encode worker drives.
//
// A VisionTower turns a batch of preprocessed items into post-merge
// embeddings. Inputs are packed patch rows (see epd/preprocess.h):
//   item i: patches [grid_i.patches(), patch_dim] float32, row-major,
//           patch_dim = 3 * temporal_patch * patch * patch = 3*2*14*14 = 1176.
// The output is one contiguous host buffer per half, rows concatenated in the
// batch's item order:
//   main       [sum_i tokens_i, hidden]                      dtype
//   deepstack  [sum_i tokens_i, hidden * deepstack_layers]   dtype (empty if 0)
// A backend must not assume the caller keeps the output: the worker copies
// each item's rows out, so the next Encode may reuse or free the buffer.
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
#include <span>
#include <string>
#include <vector>

#include "epd/embedding.h"
#include "epd/grid.h"
#include "epd/status.h"

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
struct TowerOutput {
  std::int64_t rows = 0;              // sum of post-merge tokens over the batch
  std::int64_t hidden = 0;
  std::int64_t deepstack_layers = 0;  // 0 when the tower has none
  DType dtype = DType::kFloat32;
  std::vector<std::byte> main;       // rows * hidden * DTypeSize(dtype)
  std::vector<std::byte> deepstack;  // rows * hidden * deepstack_layers * DTypeSize(dtype)
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
  // A short human-readable description, e.g. "torchscript:/path/model.pt (cpu, 2 threads)".
  virtual std::string Describe() const = 0;
};

}  // namespace epd
