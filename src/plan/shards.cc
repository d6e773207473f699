// See epd/plan/shards.h.
#include "epd/plan/shards.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <string>
#include <unordered_map>

#include "epd/core/status.h"

namespace epd {

std::uint64_t ShardsSampler::Mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

ShardsSampler::ShardsSampler(const ShardsOptions& options)
    : options_(options),
      full_rate_(options.rate >= 1),
      head_(options.exact_keys.begin(), options.exact_keys.end()),
      stack_(1 << 16) {
  if (!(options.rate > 0 && options.rate <= 1)) {
    throw Error(
        Status(StatusCode::kInvalidArgument, "SHARDS rate must be in (0, 1], got " + std::to_string(options.rate)));
  }
  threshold_ = full_rate_ ? ~std::uint64_t{0} : static_cast<std::uint64_t>(std::ldexp(options.rate, 64));
}

double ShardsSampler::rate() const { return full_rate_ ? 1.0 : std::ldexp(static_cast<double>(threshold_), -64); }

void ShardsSampler::Access(const CacheAccess& a) {
  const Weights w = Weights::Of(a);
  total_ += w;
  ++accesses_;
  const bool head = !head_.empty() && head_.count(a.key) != 0;
  const std::uint64_t m = Mix(a.key);
  if (!head && !full_rate_ && m >= threshold_) return;
  ++sampled_;
  const double r = rate();
  const std::size_t before = stack_.keys();
  // Class 0: the head, counted as is; class 1: the sampled tail, scaled.
  const ByteStackDistance::Split d = stack_.AccessSplit(a.key, a.bytes, head ? 0 : 1);
  ReuseHistogram& hist = head ? head_hist_ : tail_hist_;
  const Weights weight = w.Scaled(head ? 1 : 1 / r);
  if (d.cold) {
    hist.RecordCold(weight);
  } else {
    hist.Record(static_cast<double>(a.bytes + d.above[0]) + static_cast<double>(d.above[1]) / r, weight);
  }
  if (head || stack_.keys() == before) return;  // the head, or a key already sampled
  ++tail_keys_;
  if (options_.max_keys == 0) return;
  heap_.emplace(m, a.key);
  while (tail_keys_ > options_.max_keys) {
    const auto [top, key] = heap_.top();
    heap_.pop();
    stack_.Forget(key);
    --tail_keys_;
    threshold_ = top;
    full_rate_ = false;
  }
}

std::vector<std::uint64_t> HeavyHitters(std::span<const CacheAccess> trace, std::size_t k) {
  std::unordered_map<std::uint64_t, std::uint64_t> counts;
  counts.reserve(2 * k + 1);
  for (const CacheAccess& a : trace) {
    auto it = counts.find(a.key);
    if (it != counts.end()) {
      ++it->second;
    } else if (counts.size() < k) {
      counts.emplace(a.key, 1);
    } else {
      for (auto i = counts.begin(); i != counts.end();) {
        i = --i->second == 0 ? counts.erase(i) : std::next(i);
      }
    }
  }
  // Most frequent first (ties by key), so a prefix is a smaller head.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranked(counts.begin(), counts.end());
  std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  std::vector<std::uint64_t> out;
  out.reserve(ranked.size());
  for (const auto& [key, c] : ranked) out.push_back(key);
  return out;
}

ReuseHistogram ShardsSampler::histogram() const {
  ReuseHistogram out(ReuseHistogram::Mode::kBucketed);
  out.AddTotal(total_);
  out.Merge(head_hist_, {1, 1, 1});
  const Weights& head = head_hist_.recorded();
  const Weights& tail = tail_hist_.recorded();
  auto ratio = [](double truth, double sampled) { return sampled > 0 ? truth / sampled : 0.0; };
  out.Merge(tail_hist_,
            {ratio(total_.objects - head.objects, tail.objects), ratio(total_.bytes - head.bytes, tail.bytes),
             ratio(total_.seconds - head.seconds, tail.seconds)});
  return out;
}

std::size_t ShardsSampler::memory_bytes() const {
  return stack_.memory_bytes() + heap_.size() * sizeof(std::pair<std::uint64_t, std::uint64_t>) +
         head_hist_.memory_bytes() + tail_hist_.memory_bytes() + head_.size() * 32 +
         head_.bucket_count() * sizeof(void*);
}

}  // namespace epd
