// src/worker/worker_test_util.h (test-only): image fixtures, result
// collection and the set-up shared by the worker suites (WorkerRig).
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "epd/worker/encode_worker.h"
#include "fake_tower.h"
#include "test_images.h"

namespace epd::testing {

// A PNG of width x height whose pixels depend on `seed`, so equal
// (size, seed) give equal bytes and different seeds give different images.
inline std::string Png(int width, int height, int seed) {
  RgbImage img = PatternImage(width, height);
  for (std::uint8_t& p : img.pixels) p = static_cast<std::uint8_t>(p + seed * 37);
  Bytes b = EncodePngRgb(img);
  return std::string(b.begin(), b.end());
}

inline std::string ToString(const Bytes& b) { return std::string(b.begin(), b.end()); }
inline Bytes ToBytes(const std::string& s) { return Bytes(s.begin(), s.end()); }

// What FakeTower must produce for `media`, computed without the worker.
inline Embedding Expected(const std::string& media, const FakeTowerOptions& tower = {},
                          const PreprocessConfig& cfg = {}) {
  StatusOr<PreprocessedImage> pre = DecodeAndPreprocess(ToBytes(media), cfg);
  EXPECT_TRUE(pre.ok()) << pre.status().ToString();
  return FakeTower::Reference(*pre, tower);
}

inline void ExpectSameEmbedding(const Embedding& got, const Embedding& want) {
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.hidden, want.hidden);
  EXPECT_EQ(got.deepstack_layers, want.deepstack_layers);
  EXPECT_EQ(got.dtype, want.dtype);
  EXPECT_EQ(got.grid, want.grid) << "grid (" << got.grid.t << ", " << got.grid.h << ", " << got.grid.w
                                 << ") instead of (" << want.grid.t << ", " << want.grid.h << ", " << want.grid.w
                                 << ")";
  EXPECT_TRUE(got.main == want.main) << "main halves differ";
  EXPECT_TRUE(got.deepstack == want.deepstack) << "deepstack halves differ";
}

// Records every callback, keyed by request id.
struct Collector {
  std::map<std::string, RequestResult> done;
  std::map<std::string, std::vector<ItemResult>> items;  // in delivery order

  RequestCallbacks For(const std::string& id) {
    return {[this, id](const ItemResult& r) { items[id].push_back(r); },
            [this](const RequestResult& r) {
              EXPECT_EQ(done.count(r.id), 0u) << "on_done fired twice for " << r.id;
              done[r.id] = r;
            }};
  }
};

inline EncodeRequest Request(std::string id, std::vector<std::string> media) {
  EncodeRequest r{std::move(id), {}};
  for (std::string& m : media) {
    EncodeItemInput in;
    in.media = std::move(m);
    r.items.push_back(std::move(in));
  }
  return r;
}

// The set-up of every worker suite (encode_worker_test, fair_worker_test,
// video_worker_test, worker_device_tier_test): options for the test model, a
// worker over a FakeTower whose calls land in state_, the results collected
// per request in c_, and a drain loop. A suite's fixture derives from its
// gtest base and from this.
class WorkerRig {
 public:
  // The test model's options with `decode_threads` prefetch helpers.
  static WorkerOptions Options(int decode_threads) {
    WorkerOptions o;
    o.model_id = "test-model";
    o.decode_threads = decode_threads;
    return o;
  }

  // A worker over a FakeTower of options `t` (recording into a fresh
  // state_), or over `tower` when given (which should record into state_).
  std::unique_ptr<EncodeWorker> Make(WorkerOptions o, FakeTowerOptions t = {},
                                     std::unique_ptr<VisionTower> tower = nullptr) {
    tower_options_ = t;
    if (tower == nullptr) {
      state_ = std::make_shared<FakeTowerState>();
      tower = std::make_unique<FakeTower>(t, state_);
    }
    auto w = EncodeWorker::Create(std::move(o), std::move(tower));
    EXPECT_TRUE(w.ok()) << w.status().ToString();
    return w.ok() ? std::move(*w) : nullptr;
  }

  // Steps until nothing is queued, held or decoding; every Step runs a batch
  // unless it leaves nothing to do (a video whose chunks all hit).
  static void Drain(EncodeWorker& w) {
    while (w.HasQueuedWork()) {
      if (w.Step() == 0) {
        ASSERT_FALSE(w.HasQueuedWork()) << "Step() ran no batch with work left";
      }
    }
  }

  // Handles video decodes until none is pending (the decode threads finish
  // them; Poll delivers what needs no tower).
  static void Settle(EncodeWorker& w) {
    while (w.DecodesPending() > 0) {
      if (w.Poll() == 0) std::this_thread::yield();
    }
  }

 protected:
  FakeTowerOptions tower_options_;
  std::shared_ptr<FakeTowerState> state_;
  Collector c_;
};

}  // namespace epd::testing
