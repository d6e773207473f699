// ShmArena (the server's side) and ShmMapping (the client's side) without
// gRPC: spans, leases, expiry on an injected clock, refusals, reuse, and who
// may open the memfd.
#include "shm_arena.h"

#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <string>

#include "shm_mapping.h"

namespace epd::internal {
namespace {

using std::chrono::milliseconds;

// A clock the test moves by hand.
struct ManualClock {
  ShmArena::Clock::time_point now{};
  std::function<ShmArena::Clock::time_point()> Fn() {
    return [this] { return now; };
  }
};

std::unique_ptr<ShmArena> MakeArena(std::int64_t bytes, milliseconds lease, ManualClock* clock) {
  StatusOr<std::unique_ptr<ShmArena>> a = ShmArena::Create(bytes, lease, clock != nullptr ? clock->Fn() : nullptr);
  EXPECT_TRUE(a.ok()) << a.status().ToString();
  return a.ok() ? std::move(*a) : nullptr;
}

TEST(ShmArenaTest, SpansAreDisjointAlignedAndReadableThroughAReadOnlyMapping) {
  auto arena = MakeArena(4096, milliseconds(1000), nullptr);
  ASSERT_NE(arena, nullptr);
  auto a = arena->Acquire("", 100);  // 2 granules
  auto b = arena->Acquire("", 64);
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_EQ(a->offset, 0u);
  EXPECT_EQ(b->offset, 128u);
  EXPECT_EQ(a->length, 100u);
  EXPECT_NE(a->generation, b->generation);
  for (int i = 0; i < 100; ++i) a->data[i] = static_cast<std::byte>(i * 3);
  for (int i = 0; i < 64; ++i) b->data[i] = static_cast<std::byte>(255 - i);

  StatusOr<std::shared_ptr<const ShmMapping>> m =
      ShmMapping::Open(getpid(), arena->fd(), arena->segment(), arena->capacity());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  for (int i = 0; i < 100; ++i) ASSERT_EQ((*m)->data()[i], static_cast<std::byte>(i * 3)) << i;
  for (int i = 0; i < 64; ++i) ASSERT_EQ((*m)->data()[128 + i], static_cast<std::byte>(255 - i)) << i;
  // Bytes written after the client mapped the arena show through too.
  a->data[5] = std::byte{0x5a};
  EXPECT_EQ((*m)->data()[5], std::byte{0x5a});

  const ShmStats s = arena->Stats();
  EXPECT_EQ(s.capacity_bytes, 4096);
  EXPECT_EQ(s.leased_bytes, 192);
  EXPECT_EQ(s.leases, 2);
  EXPECT_EQ(s.items, 2u);
}

TEST(ShmArenaTest, LeaseExpiresAtItsDeadlineAndItsSpanIsReused) {
  ManualClock clock;
  auto arena = MakeArena(256, milliseconds(100), &clock);
  ASSERT_NE(arena, nullptr);
  auto a = arena->Acquire("", 256);
  ASSERT_TRUE(a.has_value());
  EXPECT_FALSE(arena->Acquire("", 64).has_value());  // full
  clock.now += milliseconds(99);
  EXPECT_EQ(arena->Stats().leases, 1);
  clock.now += milliseconds(1);
  ShmStats s = arena->Stats();
  EXPECT_EQ(s.leases, 0);
  EXPECT_EQ(s.leased_bytes, 0);
  EXPECT_EQ(s.expired, 1u);
  auto b = arena->Acquire("", 256);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->offset, a->offset);
  // The expired lease's release is refused, and does not end the new one.
  EXPECT_EQ(arena->Release(a->offset, a->generation).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(arena->Stats().leases, 1);
  EXPECT_TRUE(arena->Release(b->offset, b->generation).ok());
}

TEST(ShmArenaTest, ReleaseTwiceOrWithAWrongGenerationIsRefusedAndCounted) {
  ManualClock clock;
  auto arena = MakeArena(1024, milliseconds(1000), &clock);
  ASSERT_NE(arena, nullptr);
  auto a = arena->Acquire("", 64);
  ASSERT_TRUE(a.has_value());
  Status wrong = arena->Release(a->offset, a->generation + 1);
  EXPECT_EQ(wrong.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(wrong.message().find("generation " + std::to_string(a->generation + 1)), std::string::npos)
      << wrong.message();
  EXPECT_EQ(arena->Stats().leases, 1);  // the refusal changed nothing
  EXPECT_TRUE(arena->Release(a->offset, a->generation).ok());
  EXPECT_EQ(arena->Release(a->offset, a->generation).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(arena->Release(512, 1).code(), StatusCode::kFailedPrecondition);  // never handed out
  const ShmStats s = arena->Stats();
  EXPECT_EQ(s.released, 1u);
  EXPECT_EQ(s.refused_releases, 3u);
  EXPECT_EQ(s.leases, 0);
}

TEST(ShmArenaTest, FullArenaRefusesUntilNeighboursAreReleasedAndCoalesced) {
  ManualClock clock;
  auto arena = MakeArena(std::int64_t{4} * 64, milliseconds(1000), &clock);
  ASSERT_NE(arena, nullptr);
  auto s0 = arena->Acquire("", 64), s1 = arena->Acquire("", 64), s2 = arena->Acquire("", 64),
       s3 = arena->Acquire("", 64);
  ASSERT_TRUE(s0 && s1 && s2 && s3);
  EXPECT_FALSE(arena->Acquire("", 1).has_value());
  ASSERT_TRUE(arena->Release(s1->offset, s1->generation).ok());
  EXPECT_FALSE(arena->Acquire("", 128).has_value());  // one free granule only
  ASSERT_TRUE(arena->Release(s2->offset, s2->generation).ok());
  auto big = arena->Acquire("", 128);  // s1 and s2, merged
  ASSERT_TRUE(big.has_value());
  EXPECT_EQ(big->offset, 64u);
  EXPECT_EQ(arena->Stats().leased_bytes, 256);
}

TEST(ShmArenaTest, OneKeySharesOneSpanWrittenOnce) {
  ManualClock clock;
  auto arena = MakeArena(std::int64_t{4} * 64, milliseconds(1000), &clock);
  ASSERT_NE(arena, nullptr);
  auto a = arena->Acquire("A", 64);
  ASSERT_TRUE(a.has_value());
  EXPECT_TRUE(a->fresh);
  // Not findable until published: a second writer gets its own span.
  auto a_unpublished = arena->Acquire("A", 64);
  ASSERT_TRUE(a_unpublished.has_value());
  EXPECT_TRUE(a_unpublished->fresh);
  EXPECT_NE(a_unpublished->offset, a->offset);
  ASSERT_TRUE(arena->Release(a_unpublished->offset, a_unpublished->generation).ok());
  arena->Publish(*a);
  auto b = arena->Acquire("A", 64);
  ASSERT_TRUE(b.has_value());
  EXPECT_FALSE(b->fresh);
  EXPECT_EQ(b->offset, a->offset);
  EXPECT_NE(b->generation, a->generation);
  ShmStats s = arena->Stats();
  EXPECT_EQ(s.leases, 2);
  EXPECT_EQ(s.leased_bytes, 64);  // one span, however many leases
  EXPECT_EQ(s.reused, 1u);
  ASSERT_TRUE(arena->Release(a->offset, a->generation).ok());
  EXPECT_EQ(arena->Release(a->offset, a->generation).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(arena->Release(b->offset, b->generation).ok());
  s = arena->Stats();
  EXPECT_EQ(s.leases, 0);
  EXPECT_EQ(s.leased_bytes, 0);
  // Idle, not freed: the next hit on A leases it again without a write.
  auto c = arena->Acquire("A", 64);
  ASSERT_TRUE(c.has_value());
  EXPECT_FALSE(c->fresh);
  EXPECT_EQ(c->offset, a->offset);
}

TEST(ShmArenaTest, IdleSpansAreEvictedLeastRecentlyUsedFirstAndLeasedOnesNever) {
  ManualClock clock;
  auto arena = MakeArena(std::int64_t{3} * 64, milliseconds(1000), &clock);
  ASSERT_NE(arena, nullptr);
  std::map<std::string, ShmArena::Span> spans;
  for (const char* k : {"A", "B", "C"}) {
    auto s = arena->Acquire(k, 64);
    ASSERT_TRUE(s.has_value() && s->fresh);
    arena->Publish(*s);
    spans[k] = *s;
  }
  // Idle in the order B, A; C stays leased.
  ASSERT_TRUE(arena->Release(spans["B"].offset, spans["B"].generation).ok());
  ASSERT_TRUE(arena->Release(spans["A"].offset, spans["A"].generation).ok());
  auto d = arena->Acquire("D", 64);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->offset, spans["B"].offset);  // B was idle longest
  EXPECT_EQ(arena->Stats().evicted, 1u);
  auto a = arena->Acquire("A", 64);  // still there
  ASSERT_TRUE(a.has_value());
  EXPECT_FALSE(a->fresh);
  // Everything leased now (A, C, D): a new key finds no room.
  EXPECT_FALSE(arena->Acquire("E", 64).has_value());
  EXPECT_EQ(arena->Stats().evicted, 1u);
}

TEST(ShmArenaTest, RejectsNonPositiveSizeOrLease) {
  EXPECT_EQ(ShmArena::Create(0, milliseconds(10)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ShmArena::Create(4096, milliseconds(0)).status().code(), StatusCode::kInvalidArgument);
}

TEST(ShmArenaTest, MemfdHasMode0600AndSealedSize) {
  auto arena = MakeArena(4096, milliseconds(1000), nullptr);
  ASSERT_NE(arena, nullptr);
  struct stat st = {};
  ASSERT_EQ(fstat(arena->fd(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(st.st_size, 4096);
  EXPECT_NE(ftruncate(arena->fd(), 0), 0);  // F_SEAL_SHRINK
  char link[256] = {};
  ASSERT_GT(readlink(("/proc/self/fd/" + std::to_string(arena->fd())).c_str(), link, sizeof(link) - 1), 0);
  EXPECT_EQ(std::string(link), "/memfd:" + arena->name() + " (deleted)");
}

TEST(ShmMappingTest, AWrongSegmentIdOrDescriptorIsRefused) {
  auto arena = MakeArena(4096, milliseconds(1000), nullptr);
  ASSERT_NE(arena, nullptr);
  EXPECT_EQ(ShmMapping::Open(getpid(), arena->fd(), arena->segment() ^ 1, 4096).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(ShmMapping::Open(getpid(), 0, arena->segment(), 4096).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(ShmMapping::Open(getpid(), arena->fd(), arena->segment(), 8192).status().code(),
            StatusCode::kFailedPrecondition);  // larger than the memfd
}

// Another user (here `nobody`, uid 65534) can neither resolve nor open the
// arena through /proc. Needs root to switch users; skipped otherwise.
TEST(ShmMappingTest, AnotherUserCannotOpenTheArena) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run the open as another user";
  auto arena = MakeArena(4096, milliseconds(1000), nullptr);
  ASSERT_NE(arena, nullptr);
  const std::string path = "/proc/" + std::to_string(getpid()) + "/fd/" + std::to_string(arena->fd());
  const pid_t server = getpid();
  const int fd = arena->fd();
  const std::uint64_t segment = arena->segment();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Exit codes: 0 refused as expected, 2 could not switch user, 3 the raw
    // open succeeded, 4 ShmMapping did not say kPermissionDenied.
    if (setgroups(0, nullptr) != 0 || setresgid(65534, 65534, 65534) != 0 || setresuid(65534, 65534, 65534) != 0) {
      _exit(2);
    }
    const int f = open(path.c_str(), O_RDONLY);
    if (f >= 0 || (errno != EACCES && errno != EPERM)) _exit(3);
    if (ShmMapping::Open(server, fd, segment, 4096).status().code() != StatusCode::kPermissionDenied) _exit(4);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "2: could not become nobody, 3: open succeeded, 4: wrong status";
  // The same user can (the control).
  EXPECT_TRUE(ShmMapping::Open(server, fd, segment, 4096).ok());
}

}  // namespace
}  // namespace epd::internal
