// The encode worker with its L1 in (fake) VRAM and L2 in (fake) pinned
// memory: a tower that leaves its output on the device, the GPU tier's
// hooks, and byte-exact delivery through every path (miss, L1 hit, demotion
// and promotion, VRAM full, a failing device). Expected bytes come from
// FakeTower::Reference, which computes an image's embedding directly from
// its decoded patches, without the worker or the tier.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "epd/device_tier.h"
#include "epd/encode_worker.h"
#include "epd/fake_device.h"
#include "epd/safetensors.h"
#include "worker_test_util.h"

namespace epd {
namespace {

using testing::Collector;
using testing::Expected;
using testing::ExpectSameEmbedding;
using testing::FakeTower;
using testing::FakeTowerOptions;
using testing::FakeTowerState;
using testing::Png;
using testing::Request;

// Png(56, 56, seed): grid 1x4x4, 4 tokens; hidden 8, 2 deepstack layers,
// float32: 4 * 8 * 3 * 4 = 384 bytes per embedding.
constexpr std::int64_t kEntryBytes = 4 * 8 * 3 * 4;

class WorkerDeviceTierTest : public ::testing::Test {
 protected:
  void SetUp() override { tower_.output_on_device = true; }

  // A worker whose tier hooks come from `dev`; `l1` bytes of VRAM cache.
  // `to_device`, when set, replaces the tier's promotion hook.
  std::unique_ptr<EncodeWorker> Make(Device& dev, std::int64_t l1, std::int64_t l2 = 1 << 20,
                                     std::function<EmbeddingPtr(const EmbeddingPtr&)> to_device = nullptr) {
    hooks_ = MakeEmbeddingTierHooks(dev, &tier_stats_);
    WorkerOptions o;
    o.model_id = "test-model";
    o.decode_threads = 0;
    o.l1_bytes = l1;
    o.l2_bytes = l2;
    o.to_host = hooks_.to_host;
    o.to_device = to_device ? std::move(to_device) : hooks_.to_device;
    o.adopt_device_rows = hooks_.adopt_device_rows;
    state_ = std::make_shared<FakeTowerState>();
    auto w = EncodeWorker::Create(std::move(o), std::make_unique<FakeTower>(tower_, state_));
    EXPECT_TRUE(w.ok()) << w.status().ToString();
    return std::move(*w);
  }

  // Submits one single-image request, runs the tower if needed, returns its item.
  ItemResult EncodeOne(EncodeWorker& w, const std::string& id, const std::string& media) {
    EXPECT_TRUE(w.Submit(Request(id, {media}), c_.For(id)).ok());
    while (w.HasQueuedWork()) w.Step();
    EXPECT_EQ(c_.done.count(id), 1u);
    return c_.done[id].items.at(0);
  }

  // The item's bytes, copied to the host, equal what the tower gives `media`.
  void ExpectBytes(const ItemResult& r, const std::string& media) {
    ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    StatusOr<EmbeddingPtr> host = ToHost(r.embedding);
    ASSERT_TRUE(host.ok()) << host.status().ToString();
    ExpectSameEmbedding(**host, Expected(media, tower_));
  }

  static std::string Location(const ItemResult& r) {
    return r.embedding->on_host() ? "host" : std::string(r.embedding->resident->location());
  }

  // A FakeDevice for the test; declared first so that it outlives every
  // entry the worker, the collector or a test holds.
  FakeDevice& Dev(FakeDeviceOptions options = {}) {
    dev_ = std::make_unique<FakeDevice>(options);
    return *dev_;
  }

  std::unique_ptr<FakeDevice> dev_;
  FakeTowerOptions tower_;
  EmbeddingTierHooks hooks_;
  DeviceTierStats tier_stats_;
  std::shared_ptr<FakeTowerState> state_;
  Collector c_;
  const std::string a_ = Png(56, 56, 1);
  const std::string b_ = Png(56, 56, 2);
  const std::string c_img_ = Png(56, 56, 3);
};

TEST_F(WorkerDeviceTierTest, MissIsCopiedDeviceToDeviceIntoVramAndShipsExactBytes) {
  FakeDevice& dev = Dev();
  auto w = Make(dev, 1 << 20);
  const ItemResult r = EncodeOne(*w, "r1", a_);
  EXPECT_EQ(r.source, ItemSource::kMiss);
  EXPECT_EQ(Location(r), "device");
  EXPECT_EQ(r.embedding->nbytes(), static_cast<std::size_t>(kEntryBytes));
  ExpectBytes(r, a_);
  // Main and deepstack rows each copied device -> device once: no host round
  // trip before the shipping copy ToHost makes (d2h).
  const std::vector<FakeCopyRecord> copies = dev.copies();
  ASSERT_GE(copies.size(), 2u);
  EXPECT_EQ(copies[0].kind, CopyKind::kDeviceToDevice);
  EXPECT_EQ(copies[0].bytes, static_cast<std::size_t>(kEntryBytes / 3));
  EXPECT_EQ(copies[1].kind, CopyKind::kDeviceToDevice);
  EXPECT_EQ(copies[1].bytes, static_cast<std::size_t>(2 * kEntryBytes / 3));
  for (std::size_t i = 2; i < copies.size(); ++i) EXPECT_EQ(copies[i].kind, CopyKind::kDeviceToHost);
  EXPECT_EQ(tier_stats_.adopts, 1u);
  EXPECT_EQ(tier_stats_.adopt_bytes, static_cast<std::uint64_t>(kEntryBytes));
  EXPECT_EQ(dev.memory_stats().device_bytes_in_use, static_cast<std::size_t>(kEntryBytes));
  EXPECT_EQ(w->stats().l1_bytes, kEntryBytes);
}

TEST_F(WorkerDeviceTierTest, RepeatIsAnL1HitServedWithoutAnyCopy) {
  FakeDevice& dev = Dev();
  auto w = Make(dev, 1 << 20);
  const ItemResult first = EncodeOne(*w, "r1", a_);
  const std::size_t copies_before = dev.copies().size();
  const ItemResult again = EncodeOne(*w, "r2", a_);
  EXPECT_EQ(again.source, ItemSource::kL1);
  EXPECT_EQ(again.embedding, first.embedding);  // the cached L1 entry itself
  EXPECT_EQ(dev.copies().size(), copies_before);
  EXPECT_EQ(state_->items_encoded(), 1);
}

TEST_F(WorkerDeviceTierTest, VictimIsOffloadedToPinnedAndPromotedBackByteExact) {
  // Background completion: copies land in 64-byte chunks on another thread,
  // so delivery has to wait for them rather than read half-landed bytes.
  FakeDevice& dev = Dev({.completion = FakeCompletion::kBackground, .background_chunk_bytes = 64});
  auto w = Make(dev, kEntryBytes);  // L1 holds one entry
  ExpectBytes(EncodeOne(*w, "r1", a_), a_);
  ExpectBytes(EncodeOne(*w, "r2", b_), b_);  // a_ is demoted: VRAM -> pinned
  EXPECT_EQ(w->stats().demotions, 1u);
  EXPECT_EQ(tier_stats_.offloads, 1u);
  EXPECT_EQ(w->stats().l2_entries, 1);

  {
    const ItemResult back = EncodeOne(*w, "r3", a_);  // L2 hit: pinned -> VRAM
    EXPECT_EQ(back.source, ItemSource::kL2);
    EXPECT_EQ(Location(back), "device");
    ExpectBytes(back, a_);
  }
  EXPECT_EQ(tier_stats_.onboards, 1u);
  EXPECT_EQ(w->stats().promotions, 1u);
  EXPECT_EQ(state_->items_encoded(), 2);  // the tower never ran a_ twice

  // Once the worker and every delivered result are gone and the deferred
  // frees have run, the tier holds no VRAM and no pinned memory.
  w.reset();
  c_ = Collector{};
  while (dev.Poll() != 0) {
  }
  EXPECT_EQ(dev.memory_stats().device_bytes_in_use, 0u);
  EXPECT_EQ(dev.memory_stats().pinned_bytes_in_use, 0u);
}

TEST_F(WorkerDeviceTierTest, FullVramStillDeliversTheRowsThroughHost) {
  FakeDevice& dev = Dev({.device_capacity_bytes = kEntryBytes / 2});
  auto w = Make(dev, 1 << 20);
  const ItemResult r = EncodeOne(*w, "r1", a_);
  EXPECT_EQ(Location(r), "host");
  ExpectBytes(r, a_);
  EXPECT_EQ(tier_stats_.adopt_fallbacks, 1u);
  EXPECT_EQ(tier_stats_.adopts, 0u);
  EXPECT_EQ(EncodeOne(*w, "r2", a_).source, ItemSource::kL1);  // cached, in host memory
}

TEST_F(WorkerDeviceTierTest, FailingPromotionIsServedAsAMissAndCounted) {
  FakeDevice& dev = Dev();
  auto made = Make(dev, kEntryBytes, 1 << 20, [](const EmbeddingPtr&) -> EmbeddingPtr {
    throw Error(Internal("cudaMemcpyAsync: device lost"));
  });
  EncodeWorker& w = *made;

  ExpectBytes(EncodeOne(w, "r1", a_), a_);
  ExpectBytes(EncodeOne(w, "r2", b_), b_);  // a_ to L2
  const ItemResult r = EncodeOne(w, "r3", a_);  // promotion throws
  EXPECT_EQ(r.source, ItemSource::kMiss);
  ExpectBytes(r, a_);
  const WorkerStats s = w.stats();
  EXPECT_EQ(s.cache_errors, 1u);
  EXPECT_EQ(s.misses, 3u);
  EXPECT_EQ(state_->items_encoded(), 3);
  // Only the entry whose promotion failed was lost: a_ is back in L1 (run
  // again) and b_, demoted to make room, sits intact in L2.
  EXPECT_EQ(s.l1_entries, 1);
  EXPECT_EQ(s.l2_entries, 1);
  EXPECT_EQ(s.demotions, 2u);
}

TEST_F(WorkerDeviceTierTest, DeviceTowerWithoutAdoptHookIsRejectedAtCreate) {
  WorkerOptions o;
  o.model_id = "test-model";
  auto w = EncodeWorker::Create(o, std::make_unique<FakeTower>(tower_));
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(w.status().message().find("adopt_device_rows"), std::string::npos) << w.status().message();
}

TEST_F(WorkerDeviceTierTest, SafetensorsOfVramEntriesEqualsTheHostCopies) {
  FakeDevice& dev = Dev();
  auto w = Make(dev, 1 << 20);
  const ItemResult ra = EncodeOne(*w, "r1", a_);
  const ItemResult rb = EncodeOne(*w, "r2", b_);
  ASSERT_FALSE(ra.embedding->on_host());
  auto from_device = SerializeEmbeddingsSafetensors(std::vector<KeyedEmbedding>{{ra.key, ra.embedding},
                                                                                {rb.key, rb.embedding}});
  ASSERT_TRUE(from_device.ok()) << from_device.status().ToString();
  auto want_a = std::make_shared<const Embedding>(Expected(a_, tower_));
  auto want_b = std::make_shared<const Embedding>(Expected(b_, tower_));
  auto from_host =
      SerializeEmbeddingsSafetensors(std::vector<KeyedEmbedding>{{ra.key, want_a}, {rb.key, want_b}});
  ASSERT_TRUE(from_host.ok());
  EXPECT_EQ(*from_device, *from_host);
}

TEST_F(WorkerDeviceTierTest, ManyImagesThroughATinyVramStayExact) {
  FakeDevice& dev = Dev({.completion = FakeCompletion::kBackground, .background_chunk_bytes = 96});
  auto w = Make(dev, 2 * kEntryBytes, 3 * kEntryBytes);
  std::vector<std::string> images;
  for (int i = 0; i < 6; ++i) images.push_back(Png(56, 56, 10 + i));
  // Cycles through 6 images with room for 5 in the tiers: every step demotes,
  // some promote, some fall out of L2 and run the tower again.
  for (int round = 0; round < 4; ++round) {
    for (int i = 0; i < 6; ++i) {
      const std::string id = "r" + std::to_string(round) + "-" + std::to_string(i);
      ExpectBytes(EncodeOne(*w, id, images[static_cast<std::size_t>(i)]), images[static_cast<std::size_t>(i)]);
    }
  }
  const WorkerStats s = w->stats();
  EXPECT_EQ(s.items, 24u);
  EXPECT_EQ(s.hits_l1 + s.hits_l2 + s.misses, 24u);
  EXPECT_EQ(s.cache_errors, 0u);
  EXPECT_LE(s.l1_bytes, 2 * kEntryBytes);
  EXPECT_LE(s.l2_bytes, 3 * kEntryBytes);
}

}  // namespace
}  // namespace epd
