// FakeDevice and the Device base: completion modes, stream ordering,
// deferred release, capacities and poison.
#include "fake_device.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

namespace epd {
namespace {

std::vector<std::byte> Pattern(std::size_t n, int salt) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 131 + salt) % 251);
  return v;
}

bool AllBytesAre(const std::byte* p, std::size_t n, std::byte b) {
  for (std::size_t i = 0; i < n; ++i) {
    if (p[i] != b) return false;
  }
  return true;
}

TEST(FakeDeviceTest, ImmediateCopyLandsInsideCopyAsync) {
  FakeDevice dev;
  auto buf = dev.AllocatePinnedHost(1000);
  ASSERT_TRUE(buf.ok());
  const std::vector<std::byte> src = Pattern(1000, 1);
  ASSERT_TRUE(dev.CopyAsync(buf->data(), src.data(), 1000, CopyKind::kHostToDevice, Stream::kOnboard).ok());
  EXPECT_EQ(std::memcmp(buf->data(), src.data(), 1000), 0);
  auto ev = dev.RecordEvent(Stream::kOnboard);
  ASSERT_TRUE(ev.ok());
  EXPECT_TRUE((*ev)->Query());
  ASSERT_EQ(dev.copies().size(), 1u);
  EXPECT_EQ(dev.copies()[0].bytes, 1000u);
}

TEST(FakeDeviceTest, ManualCopyLandsFrontToBackAndItsEventWithTheLastByte) {
  FakeDevice dev({.completion = FakeCompletion::kManual});
  auto dst = dev.AllocatePinnedHost(1000);
  ASSERT_TRUE(dst.ok());
  const std::vector<std::byte> src = Pattern(1000, 2);
  ASSERT_TRUE(dev.CopyAsync(dst->data(), src.data(), 1000, CopyKind::kHostToDevice, Stream::kOnboard).ok());
  auto ev = dev.RecordEvent(Stream::kOnboard);
  ASSERT_TRUE(ev.ok());
  EXPECT_FALSE((*ev)->Query());
  EXPECT_TRUE(AllBytesAre(dst->data(), 1000, FakeDevice::kFreshPoison));

  EXPECT_EQ(dev.Advance(Stream::kOnboard, 400), 400u);
  EXPECT_EQ(std::memcmp(dst->data(), src.data(), 400), 0);
  EXPECT_TRUE(AllBytesAre(dst->data() + 400, 600, FakeDevice::kFreshPoison));
  EXPECT_FALSE((*ev)->Query());
  EXPECT_EQ(dev.Advance(Stream::kOffload), 0u);  // the other stream has nothing

  EXPECT_EQ(dev.Advance(Stream::kOnboard), 600u);
  EXPECT_TRUE((*ev)->Query());
  EXPECT_TRUE((*ev)->Synchronize().ok());
  EXPECT_EQ(std::memcmp(dst->data(), src.data(), 1000), 0);
}

TEST(FakeDeviceTest, EventCoversOnlyCopiesEnqueuedBeforeIt) {
  FakeDevice dev({.completion = FakeCompletion::kManual});
  auto dst = dev.AllocatePinnedHost(200);
  const std::vector<std::byte> src = Pattern(200, 3);
  ASSERT_TRUE(dev.CopyAsync(dst->data(), src.data(), 100, CopyKind::kHostToDevice, Stream::kOnboard).ok());
  auto first = dev.RecordEvent(Stream::kOnboard);
  ASSERT_TRUE(dev.CopyAsync(dst->data() + 100, src.data() + 100, 100, CopyKind::kHostToDevice, Stream::kOnboard).ok());
  auto second = dev.RecordEvent(Stream::kOnboard);
  EXPECT_EQ(dev.Advance(Stream::kOnboard, 100), 100u);
  EXPECT_TRUE((*first)->Query());
  EXPECT_FALSE((*second)->Query());
  dev.CompleteAll();
  EXPECT_TRUE((*second)->Query());
}

TEST(FakeDeviceTest, StreamWaitEventHoldsBackTheWaitingStream) {
  FakeDevice dev({.completion = FakeCompletion::kManual});
  auto a = dev.AllocatePinnedHost(64);
  auto b = dev.AllocatePinnedHost(64);
  const std::vector<std::byte> src = Pattern(64, 4);
  ASSERT_TRUE(dev.CopyAsync(a->data(), src.data(), 64, CopyKind::kDeviceToHost, Stream::kOffload).ok());
  auto offloaded = dev.RecordEvent(Stream::kOffload);
  ASSERT_TRUE(dev.StreamWaitEvent(Stream::kOnboard, **offloaded).ok());
  // Reads `a`, so it must run after the offload that fills `a`.
  ASSERT_TRUE(dev.CopyAsync(b->data(), a->data(), 64, CopyKind::kHostToDevice, Stream::kOnboard).ok());
  EXPECT_EQ(dev.queued(Stream::kOnboard), 2u);
  EXPECT_EQ(dev.Advance(Stream::kOnboard), 0u);
  EXPECT_EQ(dev.Advance(Stream::kOffload), 64u);
  EXPECT_EQ(dev.Advance(Stream::kOnboard), 64u);
  EXPECT_EQ(std::memcmp(b->data(), src.data(), 64), 0);
}

TEST(FakeDeviceTest, WaitOnACompletedEventEnqueuesNothing) {
  FakeDevice dev({.completion = FakeCompletion::kManual});
  auto ev = dev.RecordEvent(Stream::kOffload);  // nothing before it: complete
  ASSERT_TRUE((*ev)->Query());
  ASSERT_TRUE(dev.StreamWaitEvent(Stream::kOnboard, **ev).ok());
  EXPECT_EQ(dev.queued(Stream::kOnboard), 0u);
}

TEST(FakeDeviceTest, StreamWaitEventRejectsAnotherDevicesEvent) {
  FakeDevice a, b;
  auto ev = a.RecordEvent(Stream::kOnboard);
  EXPECT_EQ(b.StreamWaitEvent(Stream::kOnboard, **ev).code(), StatusCode::kInvalidArgument);
}

TEST(FakeDeviceTest, ReleaseAfterKeepsTheHoldUntilTheEventCompletes) {
  FakeDevice dev({.completion = FakeCompletion::kManual});
  auto dst = dev.AllocatePinnedHost(10);
  const std::vector<std::byte> src = Pattern(10, 5);
  ASSERT_TRUE(dev.CopyAsync(dst->data(), src.data(), 10, CopyKind::kHostToDevice, Stream::kOnboard).ok());
  auto ev = dev.RecordEvent(Stream::kOnboard);
  auto hold = std::make_shared<int>(7);
  std::weak_ptr<int> watch = hold;
  dev.ReleaseAfter(*ev, std::move(hold));
  EXPECT_FALSE(watch.expired());
  EXPECT_EQ(dev.Poll(), 1u);
  EXPECT_FALSE(watch.expired());
  dev.CompleteAll();
  EXPECT_EQ(dev.Poll(), 0u);
  EXPECT_TRUE(watch.expired());
}

TEST(FakeDeviceTest, ReleaseAfterACompletedOrNullEventDropsAtOnce) {
  FakeDevice dev;
  auto hold = std::make_shared<int>(1);
  std::weak_ptr<int> watch = hold;
  dev.ReleaseAfter(nullptr, std::move(hold));
  EXPECT_TRUE(watch.expired());
  EXPECT_EQ(dev.memory_stats().pending_releases, 0u);
}

TEST(FakeDeviceTest, AllocationBeyondCapacityIsResourceExhaustedAndCounted) {
  FakeDevice dev({.device_capacity_bytes = 4096, .pinned_pool_bytes = 1024});
  auto big = dev.Allocate(4097);
  EXPECT_EQ(big.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(big.status().message().find("device memory exhausted"), std::string::npos);
  auto fits = dev.Allocate(4096);
  ASSERT_TRUE(fits.ok());
  EXPECT_EQ(dev.Allocate(1).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(dev.AllocatePinnedHost(2000).status().code(), StatusCode::kResourceExhausted);
  const DeviceMemoryStats s = dev.memory_stats();
  EXPECT_EQ(s.device_alloc_failures, 2u);
  EXPECT_EQ(s.pinned_alloc_failures, 1u);
  EXPECT_EQ(s.device_bytes_in_use, 4096u);
  EXPECT_EQ(s.device_capacity_bytes, 4096u);
  EXPECT_EQ(s.pinned_capacity_bytes, 1024u);
}

TEST(FakeDeviceTest, ZeroByteAllocationIsAnEmptyBufferOfThatKind) {
  FakeDevice dev;
  auto d = dev.Allocate(0);
  auto p = dev.AllocatePinnedHost(0);
  ASSERT_TRUE(d.ok() && p.ok());
  EXPECT_TRUE(d->empty());
  EXPECT_EQ(p->kind(), MemoryKind::kPinnedHost);
  EXPECT_EQ(dev.memory_stats().pinned_bytes_in_use, 0u);
}

TEST(FakeDeviceTest, FreedBuffersArePoisonedAndReturnToThePool) {
  FakeDevice dev;
  std::byte* where = nullptr;
  {
    auto buf = dev.AllocatePinnedHost(512);
    ASSERT_TRUE(buf.ok());
    where = buf->data();
    std::memset(where, 0x11, 512);
    EXPECT_TRUE(dev.IsLive(MemoryKind::kPinnedHost, where));
    EXPECT_EQ(dev.memory_stats().pinned_bytes_in_use, 512u);
  }
  EXPECT_FALSE(dev.IsLive(MemoryKind::kPinnedHost, where));
  EXPECT_EQ(dev.memory_stats().pinned_bytes_in_use, 0u);
  // The arena is still the fake's own memory, so reading it is defined.
  EXPECT_TRUE(AllBytesAre(where, 512, FakeDevice::kFreedPoison));
}

TEST(FakeDeviceTest, CopyWithANullPointerIsInvalidArgument) {
  FakeDevice dev;
  std::byte x[4] = {};
  Status st = dev.CopyAsync(nullptr, x, 4, CopyKind::kHostToDevice, Stream::kOnboard);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("null dst"), std::string::npos) << st.message();
  EXPECT_TRUE(dev.CopyAsync(nullptr, nullptr, 0, CopyKind::kHostToDevice, Stream::kOnboard).ok());
  EXPECT_EQ(dev.copies().size(), 1u);  // the empty copy is recorded, the invalid one not
}

TEST(FakeDeviceTest, BackgroundEngineLandsEveryCopyInChunks) {
  FakeDevice dev({.completion = FakeCompletion::kBackground, .background_chunk_bytes = 333});
  auto a = dev.AllocatePinnedHost(100000);
  auto b = dev.AllocatePinnedHost(100000);
  const std::vector<std::byte> src = Pattern(100000, 6);
  ASSERT_TRUE(dev.CopyAsync(a->data(), src.data(), 100000, CopyKind::kHostToDevice, Stream::kOnboard).ok());
  auto ev = dev.RecordEvent(Stream::kOnboard);
  ASSERT_TRUE(dev.StreamWaitEvent(Stream::kOffload, **ev).ok());
  ASSERT_TRUE(dev.CopyAsync(b->data(), a->data(), 100000, CopyKind::kDeviceToHost, Stream::kOffload).ok());
  ASSERT_TRUE(dev.Synchronize(Stream::kOffload).ok());
  EXPECT_TRUE((*ev)->Query());
  EXPECT_EQ(std::memcmp(b->data(), src.data(), 100000), 0);
}

TEST(FakeDeviceTest, DescribeNamesTheMode) {
  FakeDevice dev({.completion = FakeCompletion::kManual});
  EXPECT_NE(dev.Describe().find("manual"), std::string::npos) << dev.Describe();
}

}  // namespace
}  // namespace epd
