// src/worker/video_test_clips.h (test-only): the video clips the worker's
// video suites encode, and the embeddings they must get.
//
// A "stream" whose temporal chunk k is two identical frames, the pixels of
// Png(56, 56, k + 1). A chunk whose two frames are equal has exactly the
// patch rows of that still image (Preprocess repeats a still frame to fill
// the temporal patch), so the embedding every chunk must get is computed
// independently through the image path (Expected), and a video's is their
// concatenation with grid (t, 4, 4). The fake decoder reads container bytes
// "clip:<first chunk>:<chunks>" and counts its calls.
#pragma once

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "worker_test_util.h"

namespace epd::testing {

constexpr std::int64_t kChunkTokens = 4;  // 56x56: grid 1x4x4, merge 2

inline RgbImage StreamFrame(std::int64_t chunk) {
  StatusOr<RgbImage> img = DecodeImage(ToBytes(Png(56, 56, static_cast<int>(chunk) + 1)));
  EXPECT_TRUE(img.ok());
  return std::move(*img);
}

inline std::string Clip(std::int64_t first, std::int64_t chunks) {
  return "clip:" + std::to_string(first) + ":" + std::to_string(chunks);
}

// The fake decode_video: frames of chunks [first, first + chunks), each twice.
inline StatusOr<SampledVideo> FakeDecode(std::span<const std::uint8_t> bytes, const PreprocessConfig& cfg,
                                         std::atomic<int>* calls) {
  ++*calls;
  long long first = 0, chunks = 0;
  const std::string s(bytes.begin(), bytes.end());
  if (std::sscanf(s.c_str(), "clip:%lld:%lld", &first, &chunks) != 2 || chunks < 1) {
    return InvalidArgument("not a clip: '" + s + "'");
  }
  SampledVideo v;
  for (long long k = first; k < first + chunks; ++k) {
    const RgbImage f = StreamFrame(k);
    v.frames.push_back(f);
    v.frames.push_back(f);
    v.timestamps_s.push_back(static_cast<double>(2 * k) / 2.0);
    v.timestamps_s.push_back(static_cast<double>(2 * k + 1) / 2.0);
  }
  v.grid = {chunks, 56 / cfg.patch_size, 56 / cfg.patch_size};
  v.sample_fps = 2.0;
  v.seconds_per_grid_t = 1.0;
  return v;
}

// The embedding a clip must get: its chunks' still-image embeddings, rows
// concatenated, grid (chunks, 4, 4).
inline Embedding WantClip(std::int64_t first, std::int64_t chunks, const FakeTowerOptions& t = {}) {
  Embedding want;
  for (std::int64_t k = first; k < first + chunks; ++k) {
    Embedding c = Expected(Png(56, 56, static_cast<int>(k) + 1), t);
    want.hidden = c.hidden;
    want.deepstack_layers = c.deepstack_layers;
    want.dtype = c.dtype;
    want.tokens += c.tokens;
    want.main.insert(want.main.end(), c.main.begin(), c.main.end());
    want.deepstack.insert(want.deepstack.end(), c.deepstack.begin(), c.deepstack.end());
  }
  want.grid = {chunks, 4, 4};
  return want;
}

inline EncodeItemInput VideoItem(std::string container) {
  EncodeItemInput item;
  item.video = VideoInput{MediaBytes(std::move(container)), {}, std::nullopt};
  return item;
}

inline EncodeRequest Req(std::string id, std::vector<EncodeItemInput> items) {
  return {std::move(id), std::move(items)};
}

// The s_0 a batch records for an item (FakeTowerState::batch_ids): the first
// main value of its embedding, here computed through the image path.
inline float S0(const std::string& still) {
  const Embedding e = Expected(still);
  float v;
  std::memcpy(&v, e.main.data(), sizeof v);
  return v;
}
// A clip's chunk k is the still Png(56, 56, k + 1).
inline std::string Chunk(int k) { return Png(56, 56, k + 1); }

}  // namespace epd::testing
