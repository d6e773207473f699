// The encode worker with its L1 in (fake) VRAM and L2 in (fake) pinned
// memory: a tower that leaves its output on the device, the GPU tier's
// hooks, and byte-exact delivery through every path (miss, L1 hit, demotion
// and promotion, VRAM full, a failing device). Expected bytes come from
// FakeTower::Reference, which computes an image's embedding directly from
// its decoded patches, without the worker or the tier.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "epd/gpu/device_tier.h"
#include "epd/worker/encode_worker.h"
#include "epd/worker/safetensors.h"
#include "epd/worker/worker_loop.h"
#include "fake_device.h"
#include "test_names.h"
#include "worker_test_util.h"

namespace epd {
namespace {

using test_util::Name;

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
constexpr std::int64_t kEntryBytes = std::int64_t{4} * 8 * 3 * 4;
// The FakeDevice's arenas round every block up to 256 bytes: one entry
// takes 512 bytes of "VRAM" or pinned pool.
constexpr std::size_t kEntryBlock = 512;

// A FakeTower whose output `mutate` may spoil, and which may deny leaving
// its output on the device although it does.
class SpoilingTower : public FakeTower {
 public:
  SpoilingTower(FakeTowerOptions options, std::shared_ptr<FakeTowerState> state, bool declares_device)
      : FakeTower(options, std::move(state)), declares_device_(declares_device) {}
  StatusOr<TowerOutput> Encode(std::span<const TowerItem> items) override {
    StatusOr<TowerOutput> out = FakeTower::Encode(items);
    if (out.ok() && mutate) mutate(*out);
    return out;
  }
  bool output_on_device() const override { return declares_device_; }

  std::function<void(TowerOutput&)> mutate;  // set between batches only

 private:
  const bool declares_device_;
};

// ToHost on a kManual device: the copy waits in the queue, so land it from
// this thread while another waits for it.
StatusOr<EmbeddingPtr> ToHostLanding(FakeDevice& dev, const EmbeddingPtr& e) {
  std::future<StatusOr<EmbeddingPtr>> f = std::async(std::launch::async, [&] { return ToHost(e); });
  while (f.wait_for(std::chrono::milliseconds(1)) != std::future_status::ready) dev.CompleteAll();
  return f.get();
}

// Equal shape and bytes, without gtest (for other threads).
bool SameBytes(const Embedding& got, const Embedding& want) {
  return got.tokens == want.tokens && got.hidden == want.hidden && got.deepstack_layers == want.deepstack_layers &&
         got.dtype == want.dtype && got.main == want.main && got.deepstack == want.deepstack;
}

class WorkerDeviceTierTest : public ::testing::Test, protected testing::WorkerRig {
 protected:
  void SetUp() override { tower_.output_on_device = true; }
  // The collected results hold device memory: dropped before dev_ (c_ is a
  // base's member, destroyed after this fixture's own).
  void TearDown() override { c_ = testing::Collector{}; }

  // A worker whose tier hooks come from `dev`; `l1` bytes of VRAM cache.
  // `to_device`, when set, replaces the tier's promotion hook.
  std::unique_ptr<EncodeWorker> Make(Device& dev, std::int64_t l1, std::int64_t l2 = 1 << 20,
                                     std::function<EmbeddingPtr(const EmbeddingPtr&)> to_device = nullptr) {
    return MakeWith(dev, l1, l2, [&](WorkerOptions& o) {
      if (to_device) o.to_device = std::move(to_device);
    });
  }

  // As Make, with `tweak` applied to the options last and, when given,
  // `tower` instead of a FakeTower (it must share state_).
  std::unique_ptr<EncodeWorker> MakeWith(Device& dev, std::int64_t l1, std::int64_t l2,
                                         const std::function<void(WorkerOptions&)>& tweak,
                                         std::unique_ptr<VisionTower> tower = nullptr) {
    hooks_ = MakeEmbeddingTierHooks(dev, &tier_stats_);
    WorkerOptions o = Options(0);
    o.l1_capacity_bytes = l1;
    o.l2_capacity_bytes = l2;
    o.to_host = hooks_.to_host;
    o.to_device = hooks_.to_device;
    o.adopt_device_rows = hooks_.adopt_device_rows;
    if (tweak) tweak(o);
    return WorkerRig::Make(std::move(o), tower_, std::move(tower));
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

  // A FakeDevice for the test; declared first of the fixture's members so
  // that it outlives every entry the worker or a test holds (TearDown drops
  // the collector's).
  FakeDevice& Dev(FakeDeviceOptions options = {}) {
    dev_ = std::make_unique<FakeDevice>(options);
    return *dev_;
  }

  // Drops the worker and every delivered result, runs the deferred frees and
  // expects the device to hold no memory at all.
  void ExpectAllMemoryReturned(FakeDevice& dev, std::unique_ptr<EncodeWorker>& w) {
    w.reset();
    c_ = Collector{};
    while (dev.Poll() != 0) {
    }
    const DeviceMemoryStats m = dev.memory_stats();
    EXPECT_EQ(m.device_bytes_in_use, 0u);
    EXPECT_EQ(m.pinned_bytes_in_use, 0u);
    EXPECT_EQ(m.pending_releases, 0u);
  }

  static void ExpectStatsAddUp(const WorkerStats& s) { EXPECT_EQ(s.hits_l1 + s.hits_l2 + s.misses + s.joins, s.items); }

  std::unique_ptr<FakeDevice> dev_;
  FakeTowerOptions tower_;
  EmbeddingTierHooks hooks_;
  DeviceTierStats tier_stats_;
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
  EXPECT_EQ(w->stats().l1_used_bytes, kEntryBytes);
}

TEST_F(WorkerDeviceTierTest, DeliveredVramEntryIsReadableInPlaceWithoutACopy) {
  // FakeDevice's "VRAM" is host memory, so the test can read the block an
  // in-process consumer on the GPU would read on the device.
  FakeDevice& dev = Dev({.completion = FakeCompletion::kBackground, .background_chunk_bytes = 64});
  auto w = Make(dev, 1 << 20);
  const ItemResult r = EncodeOne(*w, "r1", a_);
  ASSERT_TRUE(r.status.ok());
  ASSERT_FALSE(r.embedding->on_host());
  const std::size_t copies = dev.copies().size();
  ASSERT_TRUE(r.embedding->resident->Wait().ok());
  const Embedding want = Expected(a_, tower_);
  const std::byte* p = r.embedding->resident->data();
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(std::equal(want.main.begin(), want.main.end(), p)) << "main rows differ";
  EXPECT_TRUE(std::equal(want.deepstack.begin(), want.deepstack.end(), p + want.main.size()))
      << "deepstack rows differ";
  EXPECT_EQ(dev.copies().size(), copies);  // nothing copied to read it
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
  auto made = Make(dev, kEntryBytes, 1 << 20,
                   [](const EmbeddingPtr&) -> EmbeddingPtr { throw Error(Internal("cudaMemcpyAsync: device lost")); });
  EncodeWorker& w = *made;

  ExpectBytes(EncodeOne(w, "r1", a_), a_);
  ExpectBytes(EncodeOne(w, "r2", b_), b_);      // a_ to L2
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

  // With the adopt hook but no demotion hook, VRAM victims would sit in L2
  // unchanged: refused too, naming the missing hook.
  FakeDevice& dev = Dev();
  hooks_ = MakeEmbeddingTierHooks(dev, &tier_stats_);
  o.adopt_device_rows = hooks_.adopt_device_rows;
  o.to_device = hooks_.to_device;
  auto w2 = EncodeWorker::Create(o, std::make_unique<FakeTower>(tower_));
  ASSERT_FALSE(w2.ok());
  EXPECT_EQ(w2.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(w2.status().message().find("but to_host is not set"), std::string::npos) << w2.status().message();
}

TEST_F(WorkerDeviceTierTest, SafetensorsOfVramEntriesEqualsTheHostCopies) {
  FakeDevice& dev = Dev();
  auto w = Make(dev, 1 << 20);
  const ItemResult ra = EncodeOne(*w, "r1", a_);
  const ItemResult rb = EncodeOne(*w, "r2", b_);
  ASSERT_FALSE(ra.embedding->on_host());
  auto from_device =
      SerializeEmbeddingsSafetensors(std::vector<KeyedEmbedding>{{ra.key, ra.embedding}, {rb.key, rb.embedding}});
  ASSERT_TRUE(from_device.ok()) << from_device.status().ToString();
  auto want_a = std::make_shared<const Embedding>(Expected(a_, tower_));
  auto want_b = std::make_shared<const Embedding>(Expected(b_, tower_));
  auto from_host = SerializeEmbeddingsSafetensors(std::vector<KeyedEmbedding>{{ra.key, want_a}, {rb.key, want_b}});
  ASSERT_TRUE(from_host.ok());
  EXPECT_EQ(*from_device, *from_host);
}

TEST_F(WorkerDeviceTierTest, ManyImagesThroughATinyVramStayExact) {
  FakeDevice& dev = Dev({.completion = FakeCompletion::kBackground, .background_chunk_bytes = 96});
  auto w = Make(dev, 2 * kEntryBytes, 3 * kEntryBytes);
  std::vector<std::string> images;
  images.reserve(6);
  for (int i = 0; i < 6; ++i) images.push_back(Png(56, 56, 10 + i));
  // Cycles through 6 images with room for 5 in the tiers: every step demotes,
  // some promote, some fall out of L2 and run the tower again.
  for (int round = 0; round < 4; ++round) {
    for (int i = 0; i < 6; ++i) {
      const std::string id = Name("r", round) + "-" + std::to_string(i);
      ExpectBytes(EncodeOne(*w, id, images[static_cast<std::size_t>(i)]), images[static_cast<std::size_t>(i)]);
    }
  }
  const WorkerStats s = w->stats();
  EXPECT_EQ(s.items, 24u);
  EXPECT_EQ(s.hits_l1 + s.hits_l2 + s.misses, 24u);
  EXPECT_EQ(s.cache_errors, 0u);
  EXPECT_LE(s.l1_used_bytes, 2 * kEntryBytes);
  EXPECT_LE(s.l2_used_bytes, 3 * kEntryBytes);
}

// --- Capacities -----------------------------------------------------------

// An entry too big for L1 (here: any) but not for L2 is offloaded into L2 at
// once and its hits are onboarded from there, never promoted (the worker's
// policy; before it, every repeat ran the tower again).
TEST_F(WorkerDeviceTierTest, ZeroCapacityL1DeliversTheRowsAndCachesThemInL2) {
  FakeDevice& dev = Dev();
  auto w = Make(dev, /*l1=*/0);
  {
    const ItemResult first = EncodeOne(*w, "r1", a_);
    EXPECT_EQ(first.source, ItemSource::kMiss);
    EXPECT_EQ(Location(first), "device");
    ExpectBytes(first, a_);
    const ItemResult again = EncodeOne(*w, "r2", a_);
    EXPECT_EQ(again.source, ItemSource::kL2);
    EXPECT_EQ(Location(again), "device");
    ExpectBytes(again, a_);
  }
  EXPECT_EQ(state_->items_encoded(), 1);
  const WorkerStats s = w->stats();
  EXPECT_EQ(s.l1_entries, 0);
  EXPECT_EQ(s.l1_used_bytes, 0);
  EXPECT_EQ(s.l2_entries, 1);
  EXPECT_EQ(s.l2_used_bytes, kEntryBytes);
  EXPECT_EQ(s.promotions, 0u);
  ExpectStatsAddUp(s);
  ExpectAllMemoryReturned(dev, w);
}

TEST_F(WorkerDeviceTierTest, ZeroCapacityL2DropsVictimsWithoutAnOffload) {
  FakeDevice& dev = Dev();
  auto w = Make(dev, kEntryBytes, /*l2=*/0);
  ExpectBytes(EncodeOne(*w, "r1", a_), a_);
  ExpectBytes(EncodeOne(*w, "r2", b_), b_);                           // a_ leaves L1 for nowhere
  EXPECT_EQ(tier_stats_.offloads + tier_stats_.offload_dropped, 0u);  // no offload was even tried
  EXPECT_EQ(dev.memory_stats().pinned_bytes_in_use, 0u);
  const ItemResult r = EncodeOne(*w, "r3", a_);
  EXPECT_EQ(r.source, ItemSource::kMiss);
  ExpectBytes(r, a_);
  EXPECT_EQ(w->stats().demotions, 0u);
  ExpectStatsAddUp(w->stats());
}

TEST_F(WorkerDeviceTierTest, VramExactlyFullFallsBackToHostForTheNextEntry) {
  // Two entries fill the "VRAM" to the last byte; the third cannot be adopted.
  FakeDevice& dev = Dev({.device_capacity_bytes = 2 * kEntryBlock});
  auto w = Make(dev, 1 << 20);
  const ItemResult ra = EncodeOne(*w, "r1", a_);
  const ItemResult rb = EncodeOne(*w, "r2", b_);
  const ItemResult rc = EncodeOne(*w, "r3", c_img_);
  EXPECT_EQ(Location(ra), "device");
  EXPECT_EQ(Location(rb), "device");
  EXPECT_EQ(Location(rc), "host");
  ExpectBytes(ra, a_);
  ExpectBytes(rb, b_);
  ExpectBytes(rc, c_img_);
  EXPECT_EQ(tier_stats_.adopts, 2u);
  EXPECT_EQ(tier_stats_.adopt_fallbacks, 1u);
  EXPECT_EQ(dev.memory_stats().device_bytes_in_use, static_cast<std::size_t>(2 * kEntryBytes));
  // All three are cached, the fallback one in host memory.
  EXPECT_EQ(EncodeOne(*w, "r4", c_img_).source, ItemSource::kL1);
  EXPECT_EQ(w->stats().l1_entries, 3);
  EXPECT_EQ(w->stats().l1_used_bytes, 3 * kEntryBytes);
}

TEST_F(WorkerDeviceTierTest, PinnedPoolTooSmallDropsTheVictimAndTheTowerRunsAgain) {
  FakeDevice& dev = Dev({.pinned_pool_bytes = 256});  // no entry fits
  auto w = Make(dev, kEntryBytes);
  ExpectBytes(EncodeOne(*w, "r1", a_), a_);
  ExpectBytes(EncodeOne(*w, "r2", b_), b_);  // a_'s offload finds no block
  EXPECT_EQ(tier_stats_.offload_dropped, 1u);
  EXPECT_EQ(tier_stats_.offloads, 0u);
  EXPECT_EQ(w->stats().demotions, 0u);
  EXPECT_EQ(w->stats().l2_entries, 0);
  EXPECT_EQ(w->stats().cache_errors, 0u);  // a full pool is not a failure
  {
    const ItemResult r = EncodeOne(*w, "r3", a_);
    EXPECT_EQ(r.source, ItemSource::kMiss);
    ExpectBytes(r, a_);
  }
  EXPECT_EQ(state_->items_encoded(), 3);
  ExpectAllMemoryReturned(dev, w);
}

// --- Cancellation while a device batch is outstanding ----------------------

TEST_F(WorkerDeviceTierTest, CancelBetweenStartAndFinishStillCachesTheAdoptedRows) {
  FakeDevice& dev = Dev();
  auto w = Make(dev, 1 << 20);
  ASSERT_TRUE(w->Submit(Request("r1", {a_}), c_.For("r1")).ok());
  ASSERT_TRUE(w->StartBatch(nullptr));
  EXPECT_TRUE(w->Cancel("r1"));
  ASSERT_EQ(c_.done.count("r1"), 1u);
  EXPECT_EQ(c_.done["r1"].status.code(), StatusCode::kCancelled);
  EXPECT_EQ(w->FinishBatch(), 1);
  EXPECT_EQ(c_.items.count("r1"), 0u);  // nothing delivered after the cancel
  EXPECT_EQ(tier_stats_.adopts, 1u);

  {
    const ItemResult r = EncodeOne(*w, "r2", a_);
    EXPECT_EQ(r.source, ItemSource::kL1);  // the cancelled request's work was kept
    ExpectBytes(r, a_);
  }
  EXPECT_EQ(state_->items_encoded(), 1);
  const WorkerStats s = w->stats();
  EXPECT_EQ(s.cancelled_requests, 1u);
  EXPECT_EQ(s.errors.at(StatusCode::kCancelled), 1u);
  ExpectStatsAddUp(s);
  ExpectAllMemoryReturned(dev, w);
}

TEST_F(WorkerDeviceTierTest, FailAllWithCopiesInFlightKeepsTheTowerOutputUntilTheyLand) {
  // Manual completion: the device -> device copies are still queued after
  // FinishBatch has dropped the batch, so they read the tower's output only
  // because the adopter holds it.
  FakeDevice& dev = Dev({.completion = FakeCompletion::kManual});
  auto w = Make(dev, 1 << 20);
  ASSERT_TRUE(w->Submit(Request("r1", {a_, b_}), c_.For("r1")).ok());
  ASSERT_TRUE(w->StartBatch(nullptr));
  EXPECT_EQ(w->FailAll(Status(StatusCode::kUnavailable, "draining")), 1);
  EXPECT_EQ(c_.done["r1"].status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(w->FinishBatch(), 2);
  EXPECT_EQ(dev.queued(Stream::kOnboard), 4u);  // main + deepstack per item
  EXPECT_EQ(dev.memory_stats().pending_releases, 2u);

  // Hits before the copies land: the entries are handed out, and reading
  // them waits for their copies.
  ASSERT_TRUE(w->Submit(Request("r2", {a_, b_}), c_.For("r2")).ok());
  ASSERT_EQ(c_.done.count("r2"), 1u);
  const std::vector<ItemResult>& items = c_.done["r2"].items;
  ASSERT_EQ(items.size(), 2u);
  const std::string media[2] = {a_, b_};
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(items[static_cast<std::size_t>(i)].source, ItemSource::kL1);
    StatusOr<EmbeddingPtr> host = ToHostLanding(dev, items[static_cast<std::size_t>(i)].embedding);
    ASSERT_TRUE(host.ok()) << host.status().ToString();
    ExpectSameEmbedding(**host, Expected(media[i], tower_));
  }
  EXPECT_EQ(state_->items_encoded(), 2);
  ExpectAllMemoryReturned(dev, w);
}

TEST_F(WorkerDeviceTierTest, DestroyingTheWorkerWithADeviceBatchOutstandingLeaksNothing) {
  FakeDevice& dev = Dev();
  auto w = Make(dev, 1 << 20);
  ASSERT_TRUE(w->Submit(Request("r1", {a_}), c_.For("r1")).ok());
  ASSERT_TRUE(w->StartBatch(nullptr));
  EXPECT_EQ(w->FailAll(Status(StatusCode::kUnavailable, "stopping")), 1);
  ExpectAllMemoryReturned(dev, w);  // the batch is never finished
  EXPECT_EQ(tier_stats_.adopts, 0u);
}

// --- Malformed device output and failing hooks -----------------------------

TEST_F(WorkerDeviceTierTest, DeviceOutputWithANullPointerFailsTheBatchNamingIt) {
  FakeDevice& dev = Dev();
  auto state = std::make_shared<FakeTowerState>();
  auto tower = std::make_unique<SpoilingTower>(tower_, state, true);
  SpoilingTower* spoil = tower.get();
  auto w = MakeWith(dev, 1 << 20, 1 << 20, nullptr, std::move(tower));
  state_ = state;

  spoil->mutate = [](TowerOutput& o) { o.device_main = nullptr; };
  ItemResult r = EncodeOne(*w, "r1", a_);
  EXPECT_EQ(r.status.code(), StatusCode::kInternal);
  EXPECT_NE(r.status.message().find("main pointer is null"), std::string::npos) << r.status.message();

  spoil->mutate = [](TowerOutput& o) { o.device_deepstack = nullptr; };
  r = EncodeOne(*w, "r2", a_);
  EXPECT_EQ(r.status.code(), StatusCode::kInternal);
  EXPECT_NE(r.status.message().find("deepstack pointer is null"), std::string::npos) << r.status.message();

  // Nothing was cached or copied for the failed batches; a good one works.
  EXPECT_EQ(tier_stats_.adopts, 0u);
  spoil->mutate = nullptr;
  r = EncodeOne(*w, "r3", a_);
  EXPECT_EQ(r.source, ItemSource::kMiss);
  ExpectBytes(r, a_);
  EXPECT_EQ(w->stats().tower_failures, 2u);
}

TEST_F(WorkerDeviceTierTest, UndeclaredDeviceOutputWithoutAHookFailsTheItemNotTheProcess) {
  // The tower says its output is on the host, so Create accepts a worker
  // without a GPU tier; the output then arrives on the device anyway.
  auto state = std::make_shared<FakeTowerState>();
  WorkerOptions o;
  o.model_id = "test-model";
  o.decode_threads = 0;
  auto w = EncodeWorker::Create(o, std::make_unique<SpoilingTower>(tower_, state, false));
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  const ItemResult r = EncodeOne(**w, "r1", a_);
  EXPECT_EQ(r.status.code(), StatusCode::kInternal);
  EXPECT_NE(r.status.message().find("no adopt_device_rows hook"), std::string::npos) << r.status.message();
  EXPECT_EQ((*w)->stats().l1_entries, 0);
}

TEST_F(WorkerDeviceTierTest, FailingAdoptHooksFailOnlyTheirOwnItems) {
  FakeDevice& dev = Dev();
  int calls = 0;
  auto w = MakeWith(dev, 1 << 20, 1 << 20, [&](WorkerOptions& o) {
    o.adopt_device_rows = [&calls, real = o.adopt_device_rows](const DeviceRows& rows) -> StatusOr<EmbeddingPtr> {
      switch (calls++) {
        case 0:
          throw std::runtime_error("boom");
        case 1:
          throw 42;
        case 2:
          return EmbeddingPtr();
        case 3:
          return Status(StatusCode::kUnavailable, "no stream");
        case 4: {  // one token short of the rows it was given
          auto bad = std::make_shared<Embedding>();
          bad->tokens = rows.tokens - 1;
          bad->hidden = rows.hidden;
          bad->deepstack_layers = rows.deepstack_layers;
          bad->dtype = rows.dtype;
          bad->main.resize(static_cast<std::size_t>(bad->tokens * bad->hidden) * DTypeSize(bad->dtype));
          bad->deepstack.resize(bad->main.size() * static_cast<std::size_t>(bad->deepstack_layers));
          return EmbeddingPtr(std::move(bad));
        }
        default:
          return real(rows);
      }
    };
  });
  std::vector<std::string> media;
  media.reserve(6);
  for (int i = 0; i < 6; ++i) media.push_back(Png(56, 56, 20 + i));
  ASSERT_TRUE(w->Submit(Request("r1", media), c_.For("r1")).ok());
  while (w->HasQueuedWork()) w->Step();
  ASSERT_EQ(calls, 6);  // one batch, one call per item
  std::map<std::string, int> failures;
  int ok = 0;
  for (const ItemResult& r : c_.done["r1"].items) {
    if (r.status.ok()) {
      ++ok;
      ExpectBytes(r, media[static_cast<std::size_t>(r.index)]);
    } else {
      ++failures[std::string(StatusCodeName(r.status.code())) + ": " + r.status.message()];
    }
  }
  EXPECT_EQ(ok, 1);
  EXPECT_EQ(failures.size(), 5u);
  // 56x56: 4 tokens, hidden 8, 2 deepstack layers, float32.
  EXPECT_EQ(failures.count("INTERNAL: adopt_device_rows returned an embedding of 3 tokens x 8 x (1 + 2) float32 "
                           "(288 bytes) for rows of 4 x 8 x (1 + 2) float32"),
            1u);
  EXPECT_EQ(failures.count("INTERNAL: adopt_device_rows threw: boom"), 1u);
  EXPECT_EQ(failures.count("INTERNAL: adopt_device_rows threw a non-standard exception"), 1u);
  EXPECT_EQ(failures.count("INTERNAL: adopt_device_rows returned no embedding"), 1u);
  EXPECT_EQ(failures.count("UNAVAILABLE: no stream"), 1u);
  // Only the delivered item was cached; the others run again and succeed.
  EXPECT_EQ(w->stats().l1_entries, 1);
  ASSERT_TRUE(w->Submit(Request("r2", media), c_.For("r2")).ok());
  while (w->HasQueuedWork()) w->Step();
  for (const ItemResult& r : c_.done["r2"].items) ExpectBytes(r, media[static_cast<std::size_t>(r.index)]);
  EXPECT_EQ(state_->items_encoded(), 11);
  ExpectStatsAddUp(w->stats());
}

// A demotion that throws drops its victim only: the entry that caused it
// (a promotion or a new put) is served and kept, and L1 stays within its
// capacity.
TEST_F(WorkerDeviceTierTest, AdoptHookThatLosesTheGridFailsTheItemNamingBothGrids) {
  FakeDevice& dev = Dev();
  auto w = MakeWith(dev, 1 << 20, 1 << 20, [&](WorkerOptions& o) {
    o.adopt_device_rows = [real = o.adopt_device_rows](const DeviceRows& rows) -> StatusOr<EmbeddingPtr> {
      DeviceRows without = rows;
      without.grid = {};
      return real(without);
    };
  });
  const ItemResult r = EncodeOne(*w, "r1", a_);
  EXPECT_EQ(r.status.code(), StatusCode::kInternal);
  // a_ is 56x56: grid (1, 4, 4) by hand.
  EXPECT_NE(r.status.message().find("grid (0, 0, 0) for rows of grid (1, 4, 4)"), std::string::npos)
      << r.status.message();
  EXPECT_EQ(w->stats().l1_entries, 0);
}

TEST_F(WorkerDeviceTierTest, MissAndHitFromVramCarryTheGrid) {
  FakeDevice& dev = Dev();
  auto w = Make(dev, 1 << 20);
  const ItemResult miss = EncodeOne(*w, "r1", a_);
  const ItemResult hit = EncodeOne(*w, "r2", a_);
  ASSERT_TRUE(miss.status.ok() && hit.status.ok());
  EXPECT_EQ(Location(miss), "device");
  EXPECT_EQ(hit.source, ItemSource::kL1);
  EXPECT_EQ(miss.embedding->grid, (GridTHW{1, 4, 4}));  // 56x56 by hand
  EXPECT_EQ(hit.embedding->grid, (GridTHW{1, 4, 4}));
}

TEST_F(WorkerDeviceTierTest, FailedDemotionDuringAPromotionStillServesTheHit) {
  FakeDevice& dev = Dev();
  bool fail = false;
  auto w = MakeWith(dev, kEntryBytes, 1 << 20, [&](WorkerOptions& o) {
    o.to_host = [&fail, real = o.to_host](const EmbeddingPtr& e) -> EmbeddingPtr {
      if (fail) throw Error(Internal("cudaMemcpyAsync: device lost"));
      return real(e);
    };
  });
  ExpectBytes(EncodeOne(*w, "r1", a_), a_);
  ExpectBytes(EncodeOne(*w, "r2", b_), b_);  // a_ to L2
  fail = true;
  const ItemResult r = EncodeOne(*w, "r3", a_);  // promotes a_; demoting b_ throws
  EXPECT_EQ(r.source, ItemSource::kL2);
  ExpectBytes(r, a_);
  EXPECT_EQ(state_->items_encoded(), 2);
  const WorkerStats s = w->stats();
  EXPECT_EQ(s.cache_errors, 1u);
  EXPECT_EQ(s.l1_entries, 1);  // a_
  EXPECT_EQ(s.l2_entries, 0);  // b_ was dropped
  EXPECT_EQ(s.hits_l2, 1u);
  ExpectStatsAddUp(s);
}

TEST_F(WorkerDeviceTierTest, FailedDemotionLeavesL1WithinItsCapacity) {
  FakeDevice& dev = Dev();
  int throws_left = 0;
  auto w = MakeWith(dev, 2 * kEntryBytes, 1 << 20, [&](WorkerOptions& o) {
    o.to_host = [&throws_left, real = o.to_host](const EmbeddingPtr& e) -> EmbeddingPtr {
      if (throws_left > 0) {
        --throws_left;
        throw Error(Internal("cudaMemcpyAsync: device lost"));
      }
      return real(e);
    };
  });
  const std::string big = Png(56, 112, 4);  // 8 tokens: both small entries must go
  ExpectBytes(EncodeOne(*w, "r1", a_), a_);
  ExpectBytes(EncodeOne(*w, "r2", b_), b_);
  throws_left = 1;  // a_'s demotion fails; b_'s works
  ExpectBytes(EncodeOne(*w, "r3", big), big);
  const WorkerStats s = w->stats();
  EXPECT_EQ(s.cache_errors, 1u);
  EXPECT_LE(s.l1_used_bytes, 2 * kEntryBytes);
  EXPECT_EQ(s.l1_entries, 1);  // big
  EXPECT_EQ(s.l2_entries, 1);  // b_
  EXPECT_EQ(EncodeOne(*w, "r4", b_).source, ItemSource::kL2);
  EXPECT_EQ(EncodeOne(*w, "r5", a_).source, ItemSource::kMiss);
}

// --- Lifetime and threads --------------------------------------------------

TEST_F(WorkerDeviceTierTest, DeliveredEntryOutlivesTheWorkerAndItsCache) {
  FakeDevice& dev = Dev({.completion = FakeCompletion::kBackground, .background_chunk_bytes = 64});
  auto w = Make(dev, kEntryBytes);
  EmbeddingPtr kept = EncodeOne(*w, "r1", a_).embedding;
  EncodeOne(*w, "r2", b_);  // a_ demoted: `kept` is the VRAM copy the cache let go of
  w.reset();
  c_ = Collector{};
  ASSERT_FALSE(kept->on_host());
  StatusOr<EmbeddingPtr> host = ToHost(kept);
  ASSERT_TRUE(host.ok()) << host.status().ToString();
  ExpectSameEmbedding(**host, Expected(a_, tower_));
  while (dev.Poll() != 0) {
  }
  EXPECT_EQ(dev.memory_stats().device_bytes_in_use, static_cast<std::size_t>(kEntryBytes));  // only `kept`
  EXPECT_EQ(dev.memory_stats().pinned_bytes_in_use, 0u);
  kept.reset();
  EXPECT_EQ(dev.memory_stats().device_bytes_in_use, 0u);
}

TEST_F(WorkerDeviceTierTest, ConcurrentToHostWhileTheWorkerDemotesAndPromotesTheEntry) {
  FakeDevice& dev = Dev({.completion = FakeCompletion::kBackground, .background_chunk_bytes = 64});
  auto w = Make(dev, kEntryBytes);
  const Embedding want_a = Expected(a_, tower_);
  const EmbeddingPtr shared = EncodeOne(*w, "r0", a_).embedding;
  std::atomic<bool> stop{false};
  std::atomic<int> reads{0}, bad{0};
  std::vector<std::thread> readers;
  readers.reserve(4);
  for (int t = 0; t < 4; ++t) {
    readers.emplace_back([&] {
      while (!stop.load() || reads.load() < 40) {
        StatusOr<EmbeddingPtr> h = ToHost(shared);
        if (!h.ok() || !SameBytes(**h, want_a)) ++bad;
        ++reads;
      }
    });
  }
  // Meanwhile a_ bounces between VRAM and pinned memory.
  for (int i = 0; i < 8; ++i) {
    ExpectBytes(EncodeOne(*w, Name("b", i), b_), b_);
    ExpectBytes(EncodeOne(*w, Name("a", i), a_), a_);
  }
  stop = true;
  for (std::thread& t : readers) t.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_GE(w->stats().promotions, 8u);
  EXPECT_EQ(state_->items_encoded(), 2);
}

TEST_F(WorkerDeviceTierTest, WorkerLoopDeliversExactBytesAndReturnsAllMemory) {
  FakeDevice& dev = Dev({.completion = FakeCompletion::kBackground, .background_chunk_bytes = 128});
  std::vector<std::string> images;
  images.reserve(5);
  for (int i = 0; i < 5; ++i) images.push_back(Png(56, 56, 40 + i));
  WorkerStats s;
  {
    WorkerLoop loop(Make(dev, 2 * kEntryBytes, 2 * kEntryBytes));
    std::vector<std::future<RequestResult>> futures;
    futures.reserve(30);
    for (int i = 0; i < 30; ++i) {
      // Two items per request, sometimes the same image twice (a join or a hit).
      futures.push_back(loop.Submit(Request(
          Name("q", i), {images[static_cast<std::size_t>(i % 5)], images[static_cast<std::size_t>(i * 3 % 5)]})));
    }
    for (int i = 0; i < 30; ++i) {
      RequestResult res = futures[static_cast<std::size_t>(i)].get();
      ASSERT_TRUE(res.status.ok()) << res.status.ToString();
      ASSERT_EQ(res.items.size(), 2u);
      ExpectBytes(res.items[0], images[static_cast<std::size_t>(i % 5)]);
      ExpectBytes(res.items[1], images[static_cast<std::size_t>(i * 3 % 5)]);
    }
    loop.Shutdown(std::chrono::milliseconds(0));
    s = loop.Stats();
  }
  EXPECT_EQ(s.items, 60u);
  ExpectStatsAddUp(s);
  EXPECT_EQ(s.cache_errors, 0u);
  EXPECT_LE(s.l1_used_bytes, 2 * kEntryBytes);
  EXPECT_LE(s.l2_used_bytes, 2 * kEntryBytes);
  while (dev.Poll() != 0) {
  }
  EXPECT_EQ(dev.memory_stats().device_bytes_in_use, 0u);
  EXPECT_EQ(dev.memory_stats().pinned_bytes_in_use, 0u);
}

TEST_F(WorkerDeviceTierTest, ToHostOfAResidentEmbeddingWithANegativeShapeIsAnError) {
  FakeDevice& dev = Dev();
  auto w = Make(dev, 1 << 20);
  const ItemResult r = EncodeOne(*w, "r1", a_);
  auto bad = std::make_shared<Embedding>(*r.embedding);  // shares the resident bytes
  bad->tokens = -4;
  StatusOr<EmbeddingPtr> host = ToHost(bad);
  ASSERT_FALSE(host.ok());
  EXPECT_EQ(host.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(host.status().message().find("tokens -4"), std::string::npos) << host.status().message();
}

}  // namespace
}  // namespace epd
