// Chunk reuse is exact for the three Qwen-VL checkpoint towers
// (docs/VIDEO.md): a video of grid (t, h, w) given to the tower as ONE item
// equals, within float tolerance, what the encode worker delivers from its
// temporal chunks encoded one by one (each an item of grid (1, h, w)) and
// concatenated; and a longer clip that contains a shorter one reuses the
// shorter one's chunks (the tower runs only on the new ones).
//
// The reference is the tower's own whole-video forward, which attends over
// the whole grid with its per-frame segments (cu_seqlens) and, for
// Qwen2.5-VL, per-frame windows; it never goes through the worker, the
// chunk keys or the concatenation under test.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "epd/checkpoint_tower/checkpoint_tower.h"
#include "epd/media/video.h"
#include "epd/model/checkpoint.h"
#include "epd/worker/encode_worker.h"
#include "float_rows.h"

namespace epd {
namespace {

namespace fs = std::filesystem;

// Frames of size (rows x cols) patches' worth of pixels, random RGB8.
std::vector<RgbImage> RandomFrames(std::int64_t n, int height, int width, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> px(0, 255);
  std::vector<RgbImage> frames(static_cast<std::size_t>(n));
  for (RgbImage& f : frames) {
    f.width = width;
    f.height = height;
    f.pixels.resize(static_cast<std::size_t>(width) * height * 3);
    for (std::uint8_t& p : f.pixels) p = static_cast<std::uint8_t>(px(rng));
  }
  return frames;
}

SampledVideo Video(std::vector<RgbImage> frames, const PreprocessConfig& cfg) {
  SampledVideo v;
  v.grid = {static_cast<std::int64_t>(frames.size()) / cfg.temporal_patch_size, frames[0].height / cfg.patch_size,
            frames[0].width / cfg.patch_size};
  for (std::size_t i = 0; i < frames.size(); ++i) v.timestamps_s.push_back(static_cast<double>(i) / 2);
  v.sample_fps = 2;
  v.seconds_per_grid_t = static_cast<double>(cfg.temporal_patch_size) / 2;
  v.frames = std::move(frames);
  return v;
}

using test_util::Floats;
using test_util::RelDiff;

// The whole video as one tower item: its rows are the chunks' rows in order
// (epd/media/video.h), and the tower sees grid (t, h, w).
TowerOutput EncodeWhole(VisionTower& tower, const SampledVideo& v, const PreprocessConfig& cfg) {
  std::vector<float> patches;
  for (std::int64_t t = 0; t < v.grid.t; ++t) {
    StatusOr<PreprocessedImage> c = PreprocessChunk(v, t, cfg);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    patches.insert(patches.end(), c->patches.begin(), c->patches.end());
  }
  const TowerItem item{patches.data(), v.grid, tower.patch_dim()};
  StatusOr<TowerOutput> out = tower.Encode({&item, 1});
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  return std::move(*out);
}

struct Case {
  const char* dir;
  int rows_blocks;  // frame height in merge blocks (patch * merge pixels each)
  int cols_blocks;
};

class VideoChunkExactnessTest : public ::testing::TestWithParam<Case> {};

TEST_P(VideoChunkExactnessTest, VideoEqualsItsChunksAndLongerClipReusesThem) {
  const Case c = GetParam();
  const fs::path dir = fs::path(EPD_TINY_CHECKPOINTS) / c.dir;
  auto ckpt = OpenCheckpoint(dir.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  CheckpointTowerOptions topt;
  topt.num_threads = 1;
  auto reference_tower = LoadCheckpointTower(*ckpt, topt);
  auto worker_tower = LoadCheckpointTower(*ckpt, topt);
  ASSERT_TRUE(reference_tower.ok()) << reference_tower.status().ToString();
  ASSERT_TRUE(worker_tower.ok());
  EXPECT_TRUE((*worker_tower)->temporal_chunks_independent());
  const PreprocessConfig cfg = (*ckpt)->preprocess();

  // A 5-chunk stream; the short clip is its first 3 chunks.
  const int f = static_cast<int>(cfg.factor());
  const std::vector<RgbImage> stream =
      RandomFrames(std::int64_t{5} * cfg.temporal_patch_size, c.rows_blocks * f, c.cols_blocks * f, 11);
  const SampledVideo long_clip = Video(stream, cfg);
  const SampledVideo short_clip =
      Video({stream.begin(), stream.begin() + std::ptrdiff_t{3} * cfg.temporal_patch_size}, cfg);

  WorkerOptions o;
  o.model_id = (*ckpt)->model_id();
  o.preprocess = cfg;
  o.decode_threads = 0;
  o.decode_video = [&](std::span<const std::uint8_t> b, const VideoSampling&, const PreprocessConfig&,
                       const VideoLimits&, const std::stop_token&) -> StatusOr<SampledVideo> {
    return std::string(b.begin(), b.end()) == "short" ? short_clip : long_clip;
  };
  auto worker = EncodeWorker::Create(o, std::move(*worker_tower));
  ASSERT_TRUE(worker.ok()) << worker.status().ToString();

  std::vector<EmbeddingPtr> got;
  for (const char* name : {"short", "long"}) {
    EncodeRequest r{name, {}};
    r.items.emplace_back();
    r.items.back().video = VideoInput{MediaBytes(std::string(name)), {}, std::nullopt};
    EmbeddingPtr e;
    ASSERT_TRUE((*worker)
                    ->Submit(std::move(r), {nullptr,
                                            [&](const RequestResult& res) {
                                              ASSERT_TRUE(res.all_ok()) << res.items[0].status.ToString();
                                              e = res.items[0].embedding;
                                            }})
                    .ok());
    while ((*worker)->HasQueuedWork()) (*worker)->Step();
    ASSERT_NE(e, nullptr);
    got.push_back(e);
    // The short clip runs 3 chunks; the long one only its 2 new ones.
    EXPECT_EQ((*worker)->stats().tower_items, std::string(name) == "short" ? 3u : 5u);
  }
  EXPECT_EQ((*worker)->stats().chunk_hits, 3u);

  for (std::size_t k = 0; k < 2; ++k) {
    const SampledVideo& v = k == 0 ? short_clip : long_clip;
    SCOPED_TRACE(k == 0 ? "short clip" : "long clip");
    const TowerOutput whole = EncodeWhole(**reference_tower, v, cfg);
    const Embedding& e = *got[k];
    EXPECT_EQ(e.grid, v.grid);
    ASSERT_EQ(e.tokens, whole.tokens);
    EXPECT_LT(RelDiff(Floats(e.main), Floats(whole.main)), 1e-5);
    EXPECT_LT(RelDiff(Floats(e.deepstack), Floats(whole.deepstack)), 1e-5);
    EXPECT_GT(RelDiff(Floats(whole.main), std::vector<float>(Floats(whole.main).size(), 0.f)), 1e-3);
  }
}

// Qwen2.5-VL's frames of 9 x 5 merge blocks cut its 4 x 4-block windows short.
INSTANTIATE_TEST_SUITE_P(TinyCheckpoints, VideoChunkExactnessTest,
                         ::testing::Values(Case{"tiny-qwen2_vl", 4, 6}, Case{"tiny-qwen2_5_vl", 9, 5},
                                           Case{"tiny-qwen3_vl", 4, 6}),
                         [](const ::testing::TestParamInfo<Case>& p) {
                           std::string n = p.param.dir;
                           for (char& ch : n) ch = (ch == '-' || ch == '.') ? '_' : ch;
                           return n;
                         });

}  // namespace
}  // namespace epd
