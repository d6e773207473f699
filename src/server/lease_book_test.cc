// LeaseBook (lease_book.h) alone, on a clock the test moves by hand. Every
// expected value follows from the calls each test makes; the last test
// checks the book against a plain model of the leases (a list of every lease
// ever granted, with its deadline, holding, owner and how it ended) over a
// long seeded sequence of calls.
#include "lease_book.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <vector>

namespace epd::internal {
namespace {

using std::chrono::milliseconds;
using Clock = LeaseBook::Clock;
using Refusal = LeaseBook::Refusal;

constexpr Clock::time_point kT0{};

TEST(LeaseBookTest, GenerationsCountUpFromOneAndAreNeverReused) {
  LeaseBook book(milliseconds(100));
  EXPECT_EQ(book.Grant(10, kT0), 1u);
  EXPECT_EQ(book.Grant(10, kT0), 2u);  // the same holding, another lease
  ASSERT_TRUE(book.Release(1).ok());
  ASSERT_TRUE(book.Release(2).ok());
  // Nothing is live, yet the next lease does not take a freed number.
  EXPECT_EQ(book.Grant(10, kT0), 3u);
  EXPECT_EQ(book.counts().granted, 3u);
  EXPECT_EQ(book.counts().leases, 1);
}

TEST(LeaseBookTest, ALeaseExpiresAtItsDeadlineNotBefore) {
  LeaseBook book(milliseconds(100));
  const std::uint64_t a = book.Grant(7, kT0);
  const std::uint64_t b = book.Grant(8, kT0 + milliseconds(60));
  EXPECT_FALSE(book.ExpireNext(kT0 + milliseconds(100) - std::chrono::nanoseconds(1)).has_value());
  // a's deadline is t0 + 100 ms: due then (deadline <= now), b's at 160 ms is not.
  std::optional<std::uint64_t> ended = book.ExpireNext(kT0 + milliseconds(100));
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(*ended, 7u);
  EXPECT_FALSE(book.IsLive(a));
  EXPECT_TRUE(book.IsLive(b));
  EXPECT_FALSE(book.ExpireNext(kT0 + milliseconds(100)).has_value());
  ended = book.ExpireNext(kT0 + milliseconds(500));
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(*ended, 8u);
  EXPECT_FALSE(book.ExpireNext(kT0 + milliseconds(500)).has_value());
  EXPECT_EQ(book.counts().expired, 2u);
  EXPECT_EQ(book.counts().leases, 0);
}

TEST(LeaseBookTest, ALeaseReleasedBeforeItsDeadlineIsSkippedByExpiry) {
  LeaseBook book(milliseconds(100));
  const std::uint64_t a = book.Grant(1, kT0);
  book.Grant(2, kT0 + milliseconds(10));
  ASSERT_TRUE(book.Release(a).ok());
  // At 200 ms both deadlines have passed; only the second lease is still live.
  std::optional<std::uint64_t> ended = book.ExpireNext(kT0 + milliseconds(200));
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(*ended, 2u);
  EXPECT_FALSE(book.ExpireNext(kT0 + milliseconds(200)).has_value());
  EXPECT_EQ(book.counts().released, 1u);
  EXPECT_EQ(book.counts().expired, 1u);
}

TEST(LeaseBookTest, RefusedReleasesSayWhyChangeNothingAndAreCounted) {
  LeaseBook book(milliseconds(100));
  const std::uint64_t a = book.Grant(64, kT0);
  const std::uint64_t b = book.Grant(128, kT0);
  const std::uint64_t c = book.Grant(192, kT0 + milliseconds(50));

  EXPECT_EQ(book.Release(0).refusal, Refusal::kNeverGranted);
  EXPECT_EQ(book.Release(c + 1).refusal, Refusal::kNeverGranted);
  // b holds 128: naming 64 (a's) is refused, and b stays live.
  EXPECT_EQ(book.Release(b, 64).refusal, Refusal::kWrongHolding);
  EXPECT_TRUE(book.IsLive(b));
  const LeaseBook::Released first = book.Release(a, 64);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first.holding, 64u);
  EXPECT_EQ(book.Release(a, 64).refusal, Refusal::kEnded);  // repeated
  EXPECT_EQ(book.Release(a).refusal, Refusal::kEnded);
  ASSERT_TRUE(book.ExpireNext(kT0 + milliseconds(100)).has_value());  // b
  EXPECT_EQ(book.Release(b).refusal, Refusal::kEnded);                // expired
  const LeaseBook::Released third = book.Release(c);                  // any holding
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(third.holding, 192u);

  const LeaseBook::Counts& n = book.counts();
  EXPECT_EQ(n.refused_releases, 6u);
  EXPECT_EQ(n.released, 2u);
  EXPECT_EQ(n.expired, 1u);
  EXPECT_EQ(n.leases, 0);
}

TEST(LeaseBookTest, ReleaseOwnerEndsOnlyItsLiveLeasesAndRetiresTheOwner) {
  LeaseBook book(milliseconds(100));
  const std::uint64_t mine = book.OpenOwner(), other = book.OpenOwner();
  EXPECT_NE(mine, 0u);
  EXPECT_NE(other, 0u);
  EXPECT_NE(mine, other);
  const std::uint64_t a = book.Grant(1, kT0), b = book.Grant(2, kT0), c = book.Grant(3, kT0), d = book.Grant(4, kT0),
                      e = book.Grant(5, kT0);
  EXPECT_TRUE(book.Adopt(a, mine));
  EXPECT_TRUE(book.Adopt(b, mine));
  EXPECT_TRUE(book.Adopt(c, mine));
  EXPECT_TRUE(book.Adopt(d, other));
  EXPECT_FALSE(book.Adopt(a, other));      // one owner per lease
  EXPECT_FALSE(book.Adopt(a, mine));       // not twice either
  EXPECT_FALSE(book.Adopt(e, other + 1));  // never opened
  EXPECT_FALSE(book.Adopt(e + 1, mine));   // never granted
  EXPECT_EQ(book.OwnerOf(a), mine);
  EXPECT_EQ(book.OwnerOf(d), other);
  EXPECT_EQ(book.OwnerOf(e), 0u);
  ASSERT_TRUE(book.Release(b).ok());  // released by hand first: not the owner's to end

  std::vector<std::uint64_t> ended = book.ReleaseOwner(mine);
  std::sort(ended.begin(), ended.end());
  EXPECT_EQ(ended, (std::vector<std::uint64_t>{1, 3}));  // a's and c's holdings
  EXPECT_FALSE(book.IsLive(a));
  EXPECT_FALSE(book.IsLive(c));
  EXPECT_TRUE(book.IsLive(d));
  EXPECT_TRUE(book.IsLive(e));
  EXPECT_EQ(book.Release(a).refusal, Refusal::kEnded);
  // Retired: repeating ends nothing, and adopting under it fails.
  EXPECT_TRUE(book.ReleaseOwner(mine).empty());
  EXPECT_FALSE(book.Adopt(e, mine));
  EXPECT_TRUE(book.ReleaseOwner(999).empty());

  const LeaseBook::Counts& n = book.counts();
  EXPECT_EQ(n.owner_released, 2u);
  EXPECT_EQ(n.released, 1u);
  EXPECT_EQ(n.refused_releases, 1u);
  EXPECT_EQ(n.leases, 2);  // d and e
}

TEST(LeaseBookTest, AnOwnedLeaseStillExpiresAndLeavesItsOwner) {
  LeaseBook book(milliseconds(100));
  const std::uint64_t owner = book.OpenOwner();
  const std::uint64_t a = book.Grant(11, kT0);
  const std::uint64_t b = book.Grant(12, kT0 + milliseconds(30));
  ASSERT_TRUE(book.Adopt(a, owner));
  ASSERT_TRUE(book.Adopt(b, owner));
  std::optional<std::uint64_t> ended = book.ExpireNext(kT0 + milliseconds(100));
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(*ended, 11u);
  EXPECT_FALSE(book.Adopt(a, book.OpenOwner()));  // an ended lease cannot be adopted
  // Only b is left under the owner.
  EXPECT_EQ(book.ReleaseOwner(owner), (std::vector<std::uint64_t>{12}));
  EXPECT_EQ(book.counts().expired, 1u);
  EXPECT_EQ(book.counts().owner_released, 1u);
  // b's FIFO entry is skipped when its deadline comes.
  EXPECT_FALSE(book.ExpireNext(kT0 + milliseconds(1000)).has_value());
  EXPECT_EQ(book.counts().expired, 1u);
}

// A long seeded mix of every operation, checked call by call against a
// model that keeps every lease ever granted in a vector indexed by
// generation and scans it (no FIFO, no sets).
TEST(LeaseBookTest, AgreesWithAPlainModelOverARandomSequence) {
  enum class How { kLive, kReleased, kExpired, kOwner };
  struct ModelLease {
    Clock::time_point deadline;
    std::uint64_t holding = 0;
    std::uint64_t owner = 0;
    How how = How::kLive;
  };
  const milliseconds lease(50);
  LeaseBook book(lease);
  std::vector<ModelLease> model(1);      // [0] unused: generations start at 1
  std::map<std::uint64_t, bool> owners;  // opened -> still live
  std::uint64_t released = 0, expired = 0, by_owner = 0, refused = 0;
  Clock::time_point now = kT0;
  std::mt19937_64 rng(20261201);

  auto live_count = [&] {
    return std::count_if(model.begin() + 1, model.end(), [](const ModelLease& m) { return m.how == How::kLive; });
  };
  for (int step = 0; step < 5000; ++step) {
    now += milliseconds(rng() % 4);
    // Sweep as the stores do: everything due, oldest deadline first (ties in
    // grant order, which is generation order).
    std::vector<std::uint64_t> due;
    for (std::uint64_t g = 1; g < model.size(); ++g) {
      if (model[g].how == How::kLive && model[g].deadline <= now) due.push_back(g);
    }
    for (const std::uint64_t g : due) {
      std::optional<std::uint64_t> got = book.ExpireNext(now);
      ASSERT_TRUE(got.has_value()) << "step " << step;
      ASSERT_EQ(*got, model[g].holding) << "step " << step;
      model[g].how = How::kExpired;
      ++expired;
    }
    ASSERT_FALSE(book.ExpireNext(now).has_value()) << "step " << step;

    const std::uint64_t pick = rng() % 100;
    const std::uint64_t any_generation = rng() % (model.size() + 2);  // may be 0 or never granted
    if (pick < 40) {
      const std::uint64_t holding = rng() % 8;
      ASSERT_EQ(book.Grant(holding, now), model.size());
      model.push_back(ModelLease{now + lease, holding, 0, How::kLive});
    } else if (pick < 65) {
      const bool name_holding = rng() % 2 == 0;
      const std::uint64_t holding = rng() % 8;
      const LeaseBook::Released r =
          book.Release(any_generation, name_holding ? std::optional<std::uint64_t>(holding) : std::nullopt);
      Refusal want = Refusal::kNone;
      if (any_generation == 0 || any_generation >= model.size()) {
        want = Refusal::kNeverGranted;
      } else if (model[any_generation].how != How::kLive) {
        want = Refusal::kEnded;
      } else if (name_holding && model[any_generation].holding != holding) {
        want = Refusal::kWrongHolding;
      }
      ASSERT_EQ(r.refusal, want) << "step " << step;
      if (want == Refusal::kNone) {
        ASSERT_EQ(r.holding, model[any_generation].holding);
        model[any_generation].how = How::kReleased;
        ++released;
      } else {
        ++refused;
      }
    } else if (pick < 72) {
      const std::uint64_t owner = book.OpenOwner();
      ASSERT_FALSE(owners.contains(owner));
      ASSERT_NE(owner, 0u);
      owners[owner] = true;
    } else if (pick < 92) {
      const std::uint64_t owner =
          owners.empty() ? 1 : std::next(owners.begin(), static_cast<std::ptrdiff_t>(rng() % owners.size()))->first;
      const bool want = owners.contains(owner) && owners[owner] && any_generation > 0 &&
                        any_generation < model.size() && model[any_generation].how == How::kLive &&
                        model[any_generation].owner == 0;
      ASSERT_EQ(book.Adopt(any_generation, owner), want) << "step " << step;
      if (want) model[any_generation].owner = owner;
    } else if (!owners.empty()) {
      const std::uint64_t owner = std::next(owners.begin(), static_cast<std::ptrdiff_t>(rng() % owners.size()))->first;
      std::vector<std::uint64_t> want;
      for (std::uint64_t g = 1; g < model.size(); ++g) {
        if (owners[owner] && model[g].how == How::kLive && model[g].owner == owner) {
          want.push_back(model[g].holding);
          model[g].how = How::kOwner;
          ++by_owner;
        }
      }
      owners[owner] = false;
      std::vector<std::uint64_t> got = book.ReleaseOwner(owner);
      std::sort(got.begin(), got.end());
      std::sort(want.begin(), want.end());
      ASSERT_EQ(got, want) << "step " << step;
    }

    const LeaseBook::Counts& n = book.counts();
    ASSERT_EQ(n.leases, live_count()) << "step " << step;
    ASSERT_EQ(n.granted, model.size() - 1);
    ASSERT_EQ(n.released, released);
    ASSERT_EQ(n.expired, expired);
    ASSERT_EQ(n.owner_released, by_owner);
    ASSERT_EQ(n.refused_releases, refused);
  }
  // The sequence exercised every way a lease can end.
  EXPECT_GT(released, 0u);
  EXPECT_GT(expired, 0u);
  EXPECT_GT(by_owner, 0u);
  EXPECT_GT(refused, 0u);
}

}  // namespace
}  // namespace epd::internal
