// src/worker/fake_tower.h (test-only): a VisionTower whose output rows are a
// pure function of the item's input patches, so a test can compute the
// embedding any image must get without running a real model, and can make a
// batch fail on purpose.
//
// Output for an item with tokens T (rows 4t..4t+3 of its patches fold into
// token t, as the Qwen2-VL merger folds a 2x2 block):
//   s_t                 = sum over those 4 rows r and k in 0..7 of patches[r][k * 147]
//   main[t][c]          = s_t + 0.25 * c                      c < hidden
//   deepstack[t][l*H+c] = s_t * (l + 2) - c                   l < deepstack_layers
// converted to the tower's dtype (bfloat16: round to nearest even). Items are
// independent of their batch-mates, like a real tower's per-image attention.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "epd/core/vision_tower.h"
#include "epd/media/preprocess.h"

namespace epd::testing {

struct FakeTowerOptions {
  std::int64_t hidden = 8;
  std::int64_t deepstack_layers = 2;
  DType dtype = DType::kFloat32;
  // Return the rows as "device" output (TowerOutput::device_main etc.) in a
  // heap block the output owns, as a GPU backend with output_on_device does;
  // a FakeDevice copies from it like from VRAM.
  bool output_on_device = false;
  // VisionTower::temporal_chunks_independent(): true, since every token
  // depends on its own four patch rows only (so on one temporal slice).
  bool temporal_chunks_independent = true;
};

// What the test sees of a FakeTower the worker owns.
struct FakeTowerState {
  // One entry per Encode call: the grids of its items, in batch order, and
  // s_0 of each item (identifies which image it was).
  std::vector<std::vector<GridTHW>> batches;
  std::vector<std::vector<float>> batch_ids;
  // The next Encode returns this status instead of an output.
  std::optional<Status> fail_next;
  // The next Encode reports this many extra rows (and bytes for them).
  std::int64_t extra_rows_next = 0;
  // The tower's own output buffer, reused and overwritten by every Encode
  // (a real backend may reuse its buffers between batches).
  std::vector<std::byte> buffer;

  // Items over all Encode calls so far. Thread-safe: it may be read while
  // the worker's tower thread encodes (TSan reported the unguarded read).
  std::int64_t items_encoded() const;

  // A gate Encode waits at while closed, so a test can hold the tower busy
  // (Encode runs on the worker's tower thread). Thread-safe.
  void Close();
  void Open();
  // Blocks until `n` Encode calls have started.
  void WaitForEncodes(int n);

 private:
  friend class FakeTower;
  mutable std::mutex gate_mu_;  // also guards `batches` and `batch_ids` as Encode appends
  std::condition_variable gate_cv_;
  bool gate_closed_ = false;
  int encodes_started_ = 0;
};

class FakeTower : public VisionTower {
 public:
  explicit FakeTower(FakeTowerOptions options = {},
                     std::shared_ptr<FakeTowerState> state = std::make_shared<FakeTowerState>());

  StatusOr<TowerOutput> Encode(std::span<const TowerItem> items) override;
  std::int64_t patch_dim() const override { return 1176; }
  std::int64_t merge_size() const override { return 2; }
  std::int64_t hidden() const override { return options_.hidden; }
  std::int64_t deepstack_layers() const override { return options_.deepstack_layers; }
  DType dtype() const override { return options_.dtype; }
  bool output_on_device() const override { return options_.output_on_device; }
  bool temporal_chunks_independent() const override { return options_.temporal_chunks_independent; }
  std::string Describe() const override { return "fake"; }

  const std::shared_ptr<FakeTowerState>& state() const { return state_; }

  // The embedding this tower gives a preprocessed image, computed directly,
  // with the image's grid (as the worker must deliver it).
  static Embedding Reference(const PreprocessedImage& image, const FakeTowerOptions& options);

 private:
  FakeTowerOptions options_;
  std::shared_ptr<FakeTowerState> state_;
};

}  // namespace epd::testing
