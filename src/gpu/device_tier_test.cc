// The tier contract on FakeDevice, plus what only a fake with manual
// completion can show: copies in flight, half-landed copies, and when each
// buffer is freed.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <tuple>
#include <vector>

#include "device_tier_contract.h"
#include "fake_device.h"

namespace epd {
namespace {

using testing_util::MakeEmbedding;
using testing_util::SameAsSeed;

std::unique_ptr<Device> OpenFake(FakeCompletion mode, std::size_t device_bytes, std::size_t pinned_bytes) {
  FakeDeviceOptions opt;
  opt.device_capacity_bytes = device_bytes;
  opt.pinned_pool_bytes = pinned_bytes;
  opt.completion = mode;
  opt.background_chunk_bytes = 1000;  // not a divisor of any entry: copies land in uneven pieces
  return std::make_unique<FakeDevice>(opt);
}

INSTANTIATE_TEST_SUITE_P(Fake, DeviceTierContract,
                         ::testing::Values(DeviceFactory{"Immediate",
                                                         [](std::size_t d, std::size_t p, std::string*) {
                                                           return OpenFake(FakeCompletion::kImmediate, d, p);
                                                         }},
                                           DeviceFactory{"Background",
                                                         [](std::size_t d, std::size_t p, std::string*) {
                                                           return OpenFake(FakeCompletion::kBackground, d, p);
                                                         }}),
                         DeviceFactoryName);

constexpr std::size_t kE = 8192;  // MakeEmbedding's default: 4096 main + 4096 deepstack bytes

class ManualTierTest : public ::testing::Test {
 protected:
  ManualTierTest() : dev_(FakeDeviceOptions{.completion = FakeCompletion::kManual}) {}

  // An entry on the device whose upload has landed.
  TierEmbeddingPtr Landed(std::uint64_t seed) {
    StatusOr<TierEmbeddingPtr> v = UploadEmbedding(dev_, MakeEmbedding(seed));
    EXPECT_TRUE(v.ok()) << v.status().ToString();
    dev_.CompleteAll();
    return v.ok() ? *v : nullptr;
  }

  // ToHostEmbedding of a device entry blocks on its own D2H, which only this
  // thread lands: run it on a reader thread and land copies until it is done.
  StatusOr<Embedding> ShipWhileLanding(const TierEmbeddingPtr& v) {
    std::atomic<bool> returned{false};
    StatusOr<Embedding> shipped = InvalidArgument("not shipped");
    std::thread reader([&] {
      shipped = v->ToHostEmbedding();
      returned = true;
    });
    while (!returned.load()) {
      dev_.CompleteAll();
      std::this_thread::yield();
    }
    reader.join();
    return shipped;
  }

  FakeDevice dev_;
};

TEST_F(ManualTierTest, VictimVramIsFreedOnlyAfterItsOffloadLands) {
  DeviceTierStats stats;
  GpuCache cache(kE, 4 * kE, MakeOffloadFn(dev_, &stats), MakeOnboardFn(dev_, &stats));
  cache.Put(KeyOf(0), Landed(1), kE);
  cache.Put(KeyOf(1), Landed(2), kE);  // demotes k0: its offload is queued, not landed
  ASSERT_EQ(stats.offloads, 1u);
  EXPECT_EQ(dev_.queued(Stream::kOffload), 1u);
  // No one but the device's release list holds k0's L1 entry now.
  EXPECT_EQ(dev_.memory_stats().device_bytes_in_use, 2 * kE);
  EXPECT_EQ(dev_.memory_stats().pending_releases, 1u);

  EXPECT_EQ(dev_.Advance(Stream::kOffload, kE / 2), kE / 2);
  EXPECT_EQ(dev_.Poll(), 1u);
  EXPECT_EQ(dev_.memory_stats().device_bytes_in_use, 2 * kE) << "freed while its offload was half landed";

  EXPECT_EQ(dev_.Advance(Stream::kOffload), kE / 2);
  EXPECT_EQ(dev_.Poll(), 0u);
  EXPECT_EQ(dev_.memory_stats().device_bytes_in_use, kE);
  // Freed memory is poisoned: had the source gone early, these bytes would show it.
  std::optional<PoppedEntry<TierEmbeddingPtr>> k0 = cache.l2().Pop(KeyOf(0));
  ASSERT_TRUE(k0.has_value());
  ASSERT_TRUE(k0->value->ready());
  StatusOr<Embedding> host = k0->value->ToHostEmbedding();
  ASSERT_TRUE(host.ok());
  EXPECT_TRUE(SameAsSeed(*host, 1));
}

TEST_F(ManualTierTest, ReaderNeverSeesAHalfLandedEntry) {
  TierEmbeddingPtr l1 = Landed(7);
  StatusOr<TierEmbeddingPtr> l2 = OffloadEmbedding(dev_, l1);
  ASSERT_TRUE(l2.ok());
  EXPECT_EQ(dev_.Advance(Stream::kOffload, 3000), 3000u);
  EXPECT_FALSE((*l2)->ready());

  std::atomic<bool> returned{false};
  StatusOr<Embedding> shipped = InvalidArgument("not shipped");
  std::thread reader([&] {
    shipped = (*l2)->ToHostEmbedding();
    returned = true;
  });
  EXPECT_EQ(dev_.Advance(Stream::kOffload, 3000), 3000u);
  EXPECT_FALSE((*l2)->ready());
  // Whenever the reader got here, it cannot have returned: 2192 bytes are missing.
  EXPECT_FALSE(returned.load()) << "ToHostEmbedding returned before the copy landed";
  EXPECT_EQ(dev_.Advance(Stream::kOffload), kE - 6000);
  reader.join();
  EXPECT_TRUE((*l2)->ready());
  ASSERT_TRUE(shipped.ok()) << shipped.status().ToString();
  EXPECT_TRUE(SameAsSeed(*shipped, 7));
}

TEST_F(ManualTierTest, ShippingADeviceEntryWaitsForItsUploadThenCopiesBack) {
  StatusOr<TierEmbeddingPtr> v = UploadEmbedding(dev_, MakeEmbedding(9));
  ASSERT_TRUE(v.ok());
  EXPECT_FALSE((*v)->ready());
  // The reader first waits for the upload, then enqueues its own D2H.
  StatusOr<Embedding> shipped = ShipWhileLanding(*v);
  ASSERT_TRUE(shipped.ok()) << shipped.status().ToString();
  EXPECT_TRUE(SameAsSeed(*shipped, 9));
  const std::vector<FakeCopyRecord> copies = dev_.copies();
  ASSERT_EQ(copies.size(), 4u);  // upload main + deepstack, ship main + deepstack
  EXPECT_EQ(copies[2].kind, CopyKind::kDeviceToHost);
  EXPECT_EQ(copies[2].stream, Stream::kOffload);
  EXPECT_EQ(copies[3].bytes, 4096u);
}

// k0 is promoted while its demotion is still in flight: the onboard must
// wait on the device for the offload, never copy the pinned block's poison.
TEST_F(ManualTierTest, PromotionOfAnEntryStillBeingOffloadedWaitsForTheOffload) {
  DeviceTierStats stats;
  GpuCache cache(kE, 4 * kE, MakeOffloadFn(dev_, &stats), MakeOnboardFn(dev_, &stats));
  cache.Put(KeyOf(0), Landed(20), kE);
  cache.Put(KeyOf(1), Landed(21), kE);                       // offload k0 queued
  std::optional<TierEmbeddingPtr> k0 = cache.Get(KeyOf(0));  // onboard k0 queued; demotes k1
  ASSERT_TRUE(k0.has_value());
  EXPECT_EQ(cache.promotions(), 1u);
  EXPECT_EQ(cache.demotions(), 2u);
  EXPECT_EQ(dev_.queued(Stream::kOnboard), 2u);  // the wait, then the copy
  EXPECT_EQ(dev_.Advance(Stream::kOnboard), 0u) << "onboard ran ahead of the offload it reads";
  EXPECT_FALSE((*k0)->ready());

  EXPECT_EQ(dev_.Advance(Stream::kOffload), 2 * kE);  // k0's and k1's offloads
  EXPECT_EQ(dev_.Advance(Stream::kOnboard), kE);
  ASSERT_TRUE((*k0)->ready());
  StatusOr<Embedding> host = ShipWhileLanding(*k0);
  ASSERT_TRUE(host.ok()) << host.status().ToString();
  EXPECT_TRUE(SameAsSeed(*host, 20));

  // Every copy, in order, with its direction, stream and size.
  const std::vector<FakeCopyRecord> copies = dev_.copies();
  const std::vector<std::tuple<CopyKind, Stream, std::size_t>> want = {
      {CopyKind::kHostToDevice, Stream::kOnboard, 4096}, {CopyKind::kHostToDevice, Stream::kOnboard, 4096},
      {CopyKind::kHostToDevice, Stream::kOnboard, 4096}, {CopyKind::kHostToDevice, Stream::kOnboard, 4096},
      {CopyKind::kDeviceToHost, Stream::kOffload, kE},   {CopyKind::kHostToDevice, Stream::kOnboard, kE},
      {CopyKind::kDeviceToHost, Stream::kOffload, kE},   {CopyKind::kDeviceToHost, Stream::kOffload, 4096},
      {CopyKind::kDeviceToHost, Stream::kOffload, 4096}};
  ASSERT_EQ(copies.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(copies[i].kind, std::get<0>(want[i])) << i;
    EXPECT_EQ(copies[i].stream, std::get<1>(want[i])) << i;
    EXPECT_EQ(copies[i].bytes, std::get<2>(want[i])) << i;
  }
}

TEST_F(ManualTierTest, DroppingAnEntryBeforeItsUploadLandsDefersTheFree) {
  StatusOr<TierEmbeddingPtr> v = UploadEmbedding(dev_, MakeEmbedding(3));
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(dev_.memory_stats().device_bytes_in_use, kE);
  v = TierEmbeddingPtr();  // the only reference, while the H2D is queued
  EXPECT_EQ(dev_.memory_stats().device_bytes_in_use, kE) << "freed under an in-flight copy";
  EXPECT_EQ(dev_.Poll(), 2u);  // the host embedding and the device buffer
  dev_.CompleteAll();
  EXPECT_EQ(dev_.Poll(), 0u);
  EXPECT_EQ(dev_.memory_stats().device_bytes_in_use, 0u);
}

TEST_F(ManualTierTest, OffloadFnThrowsNothingAndDropsWhenPoolIsEmpty) {
  FakeDevice no_pool({.pinned_pool_bytes = 0, .completion = FakeCompletion::kImmediate});
  DeviceTierStats stats;
  TierCopyFn offload = MakeOffloadFn(no_pool, &stats);
  StatusOr<TierEmbeddingPtr> v = UploadEmbedding(no_pool, MakeEmbedding(1));
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(offload(*v), nullptr);
  EXPECT_EQ(stats.offload_dropped, 1u);
  EXPECT_EQ(offload(nullptr), nullptr);  // "none" passes through untouched
  EXPECT_EQ(stats.offload_dropped, 1u);
}

TEST_F(ManualTierTest, EntryOfAnotherDeviceIsInvalidArgument) {
  FakeDevice other;
  StatusOr<TierEmbeddingPtr> v = UploadEmbedding(other, MakeEmbedding(1));
  ASSERT_TRUE(v.ok());
  Status st = OffloadEmbedding(dev_, *v).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("another device"), std::string::npos) << st.message();
}

// The sizing rule's two regimes, with the byte counts worked out by hand:
// the fixed minimum slack below 1 GiB of L1 (4 x 256 MiB) and of L2
// (16 x 64 MiB), the proportional slack above.
TEST(SizeGpuTierTest, SmallTiersGetTheMinimumSlack) {
  const GpuTierSizing s = SizeGpuTier(/*l1_bytes=*/0, /*l2_bytes=*/0);
  EXPECT_EQ(s.device_bytes_limit, 268435456u);  // 256 MiB
  EXPECT_EQ(s.pinned_pool_bytes, 67108864u);    // 64 MiB
  const GpuTierSizing t = SizeGpuTier(/*l1_bytes=*/128u << 20, /*l2_bytes=*/1024u << 20);
  EXPECT_EQ(t.device_bytes_limit, 402653184u);  // 128 + 256 MiB
  EXPECT_EQ(t.pinned_pool_bytes, 1140850688u);  // 1024 + 64 MiB (1024 / 16 is exactly 64)
}

TEST(SizeGpuTierTest, LargeTiersGetProportionalSlack) {
  const GpuTierSizing s = SizeGpuTier(/*l1_bytes=*/std::size_t{8} << 30, /*l2_bytes=*/std::size_t{4} << 30);
  EXPECT_EQ(s.device_bytes_limit, 10737418240u);  // 8 GiB + 2 GiB
  EXPECT_EQ(s.pinned_pool_bytes, 4563402752u);    // 4 GiB + 256 MiB
  const GpuTierSizing t = SizeGpuTier(/*l1_bytes=*/1000000001, /*l2_bytes=*/2000000001);
  EXPECT_EQ(t.device_bytes_limit, 1268435457u);  // l1/4 = 250000000 < 256 MiB: 1000000001 + 268435456
  EXPECT_EQ(t.pinned_pool_bytes, 2125000001u);   // l2/16 = 125000000 > 64 MiB (67108864)
}

// The worker's hooks keep an item's grid with its bytes on every move: the
// adopt of tower rows (into VRAM, and into host memory when VRAM is full),
// the offload to pinned memory and the onboard back. The grid has t = 2 (a
// two-temporal-patch clip): (2, 2, 6) is 24 patches, 6 tokens after the 2x2
// merge.
TEST(EmbeddingTierHooksTest, GridTravelsWithTheRowsThroughAdoptOffloadAndOnboard) {
  const GridTHW grid{2, 2, 6};
  const std::int64_t tokens = 6, hidden = 64;
  const std::size_t entry = static_cast<std::size_t>(tokens * hidden) * 4 * 2;  // f32, 1 deepstack layer
  for (const bool vram_full : {false, true}) {
    SCOPED_TRACE(vram_full ? "VRAM full: rows copied to host" : "rows adopted into VRAM");
    // The rows themselves take one entry of VRAM; a full device has room for nothing more.
    FakeDevice dev({.device_capacity_bytes = vram_full ? entry : 4 * entry,
                    .pinned_pool_bytes = 4 * entry,
                    .completion = FakeCompletion::kImmediate});
    StatusOr<TierEmbeddingPtr> tower_rows = UploadEmbedding(dev, MakeEmbedding(9, tokens, hidden, 1));
    ASSERT_TRUE(tower_rows.ok()) << tower_rows.status().ToString();
    ASSERT_TRUE((*tower_rows)->Wait().ok());
    DeviceRows rows;
    rows.grid = grid;
    rows.tokens = tokens;
    rows.hidden = hidden;
    rows.deepstack_layers = 1;
    rows.dtype = DType::kFloat32;
    rows.main = (*tower_rows)->data();
    rows.deepstack = (*tower_rows)->data() + entry / 2;
    rows.owner = *tower_rows;

    DeviceTierStats stats;
    EmbeddingTierHooks hooks = MakeEmbeddingTierHooks(dev, &stats);
    StatusOr<EmbeddingPtr> adopted = hooks.adopt_device_rows(rows);
    ASSERT_TRUE(adopted.ok()) << adopted.status().ToString();
    EXPECT_EQ(stats.adopt_fallbacks, vram_full ? 1u : 0u);
    EXPECT_EQ((*adopted)->on_host(), vram_full);
    EXPECT_EQ((*adopted)->grid, grid);
    StatusOr<EmbeddingPtr> host = ToHost(*adopted);
    ASSERT_TRUE(host.ok()) << host.status().ToString();
    EXPECT_EQ((*host)->grid, grid);
    EXPECT_TRUE(SameAsSeed(**host, 9));
    if (vram_full) continue;

    EmbeddingPtr pinned = hooks.to_host(*adopted);
    ASSERT_NE(pinned, nullptr);
    ASSERT_FALSE(pinned->on_host());
    EXPECT_EQ(pinned->resident->location(), "pinned_host");
    EXPECT_EQ(pinned->grid, grid);
    EmbeddingPtr back = hooks.to_device(pinned);
    ASSERT_NE(back, nullptr);
    EXPECT_EQ(back->resident->location(), "device");
    EXPECT_EQ(back->grid, grid);
    StatusOr<EmbeddingPtr> shipped = ToHost(back);
    ASSERT_TRUE(shipped.ok()) << shipped.status().ToString();
    EXPECT_EQ((*shipped)->grid, grid);
    EXPECT_TRUE(SameAsSeed(**shipped, 9));
  }
}

}  // namespace
}  // namespace epd
