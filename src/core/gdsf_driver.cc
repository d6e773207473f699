// gdsf_driver: runs EmbeddingCache<std::string, int> under GDSF (or
// kAdaptive) over operations read from stdin, one per line, and prints what
// the cache did, for tests/python/test_gdsf_model.py and
// test_adaptive_model.py, which compare it with models of the rules written
// separately in Python. Test-only; not installed. Keys are hashed with 64-bit
// FNV-1a (offset basis 14695981039346656037, prime 1099511628211, over the
// key's bytes), so that a model can compute the hash kAdaptive samples by.
//
// Input: the first line is "CAPACITY FREQUENCY [POLICY]": bytes, then
// "resident" (GdsfFrequency::kResident) or the history's window in requests
// (0: the cache sizes it), then "gdsf" (the default), "probation" (GDSF with
// CacheOptions::gdsf_probation) or "adaptive"; then
//   put KEY NBYTES COST     COST in seconds, or "-" for unmeasured
//   get KEY
//   pop KEY
// Output: per operation, "evict KEY" for each victim in hook order, then one
// of "hit KEY" / "miss KEY" (get), "popped KEY" / "absent KEY" (pop), "ok"
// (put); at the end "clock C" with C printed to 17 significant digits, and
// under adaptive "leader lru|gdsf|probation", "switches N", "lru_victims N"
// and "rate R" (no duel yet: "leader gdsf", 0, 0 and "rate 0").
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>

#include "epd/core/embedding_cache.h"

namespace {

struct Fnv1a {
  std::size_t operator()(const std::string& s) const {
    std::uint64_t h = 14695981039346656037ULL;
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
    return static_cast<std::size_t>(h);
  }
};

}  // namespace

int main() {
  std::int64_t capacity = 0;
  std::string frequency, header_rest;
  if (!(std::cin >> capacity >> frequency)) return 2;
  std::getline(std::cin, header_rest);
  const bool adaptive = header_rest.find("adaptive") != std::string::npos;
  epd::CacheOptions options{adaptive ? epd::EvictionPolicy::kAdaptive : epd::EvictionPolicy::kGdsf};
  options.gdsf_probation = header_rest.find("probation") != std::string::npos;
  if (frequency == "resident") {
    options.gdsf_frequency = epd::GdsfFrequency::kResident;
  } else {
    options.gdsf_history_window = std::stoull(frequency);
  }
  epd::EmbeddingCache<std::string, int, Fnv1a> cache(
      capacity, options,
      [](const std::string& k, int&&, std::int64_t, const epd::EntryCost&) { std::printf("evict %s\n", k.c_str()); });
  std::string op, key, cost;
  std::int64_t nbytes = 0;
  while (std::cin >> op >> key) {
    if (op == "put") {
      std::cin >> nbytes >> cost;
      const double seconds = cost == "-" ? epd::EntryCost::kUnmeasured : std::stod(cost);
      cache.Put(key, 0, nbytes, {seconds});
      std::printf("ok\n");
    } else if (op == "get") {
      std::printf("%s %s\n", cache.Get(key).has_value() ? "hit" : "miss", key.c_str());
    } else if (op == "pop") {
      std::printf("%s %s\n", cache.Pop(key).has_value() ? "popped" : "absent", key.c_str());
    } else {
      std::fprintf(stderr, "gdsf_driver: unknown operation '%s'\n", op.c_str());
      return 2;
    }
  }
  std::printf("clock %.17g\n", cache.clock());
  if (adaptive) {
    const epd::PolicyDuel* duel = cache.duel();
    const char* leader = !duel ? "gdsf" : duel->lru_leads() ? "lru" : duel->probation_leads() ? "probation" : "gdsf";
    std::printf("leader %s\n", leader);
    std::printf("switches %llu\n", static_cast<unsigned long long>(duel ? duel->switches() : 0));
    std::printf("lru_victims %llu\n", static_cast<unsigned long long>(cache.lru_victims()));
    std::printf("rate %.17g\n", duel ? duel->rate() : 0.0);
  }
  return 0;
}
