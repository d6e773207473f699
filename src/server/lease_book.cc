// LeaseBook: generations, the deadline FIFO and owners (lease_book.h).
#include "lease_book.h"

#include <utility>

namespace epd::internal {

std::uint64_t LeaseBook::Grant(std::uint64_t holding, Clock::time_point now) {
  const std::uint64_t generation = next_generation_++;
  live_.emplace(generation, Live{holding, 0});
  expiry_.push_back(Expiry{now + lease_, generation});
  ++counts_.leases;
  ++counts_.granted;
  return generation;
}

std::uint64_t LeaseBook::EndLive(std::unordered_map<std::uint64_t, Live>::iterator it) {
  const Live ended = it->second;
  if (ended.owner != 0) {
    // A lease's owner is live while the lease is: ReleaseOwner ends the
    // owner's leases before it forgets the owner.
    owners_.at(ended.owner).erase(it->first);
  }
  live_.erase(it);
  --counts_.leases;
  return ended.holding;
}

std::optional<std::uint64_t> LeaseBook::ExpireNext(Clock::time_point now) {
  while (!expiry_.empty() && expiry_.front().deadline <= now) {
    const std::uint64_t generation = expiry_.front().generation;
    expiry_.pop_front();
    auto it = live_.find(generation);
    if (it == live_.end()) continue;  // ended before its deadline
    ++counts_.expired;
    return EndLive(it);
  }
  return std::nullopt;
}

LeaseBook::Released LeaseBook::Release(std::uint64_t generation, std::optional<std::uint64_t> holding) {
  auto it = live_.find(generation);
  Released out;
  if (it == live_.end()) {
    out.refusal = generation == 0 || generation >= next_generation_ ? Refusal::kNeverGranted : Refusal::kEnded;
  } else if (holding.has_value() && it->second.holding != *holding) {
    out.refusal = Refusal::kWrongHolding;
  }
  if (!out.ok()) {
    ++counts_.refused_releases;
    return out;
  }
  ++counts_.released;
  out.holding = EndLive(it);
  return out;
}

std::uint64_t LeaseBook::OpenOwner() {
  const std::uint64_t owner = next_owner_++;
  owners_.emplace(owner, std::unordered_set<std::uint64_t>{});
  return owner;
}

bool LeaseBook::Adopt(std::uint64_t generation, std::uint64_t owner) {
  auto o = owners_.find(owner);
  auto it = live_.find(generation);
  if (o == owners_.end() || it == live_.end() || it->second.owner != 0) return false;
  it->second.owner = owner;
  o->second.insert(generation);
  return true;
}

std::vector<std::uint64_t> LeaseBook::ReleaseOwner(std::uint64_t owner) {
  std::vector<std::uint64_t> holdings;
  auto o = owners_.find(owner);
  if (o == owners_.end()) return holdings;
  const std::unordered_set<std::uint64_t> generations = std::move(o->second);
  owners_.erase(o);
  holdings.reserve(generations.size());
  for (const std::uint64_t generation : generations) {
    // Every generation in an owner's set is live: ending a lease any other
    // way takes it out of the set (EndLive).
    auto it = live_.find(generation);
    it->second.owner = 0;  // its owner is gone already
    holdings.push_back(EndLive(it));
    ++counts_.owner_released;
  }
  return holdings;
}

std::uint64_t LeaseBook::OwnerOf(std::uint64_t generation) const {
  auto it = live_.find(generation);
  return it == live_.end() ? 0 : it->second.owner;
}

}  // namespace epd::internal
