// src/worker/worker_test_util.h (test-only): image fixtures and result
// collection shared by the worker tests.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <string>
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

}  // namespace epd::testing
