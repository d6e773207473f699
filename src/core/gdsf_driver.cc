// gdsf_driver: runs EmbeddingCache<std::string, int> under GDSF over
// operations read from stdin, one per line, and prints what the cache did,
// for tests/python/test_gdsf_model.py, which compares it with a model of the
// rule written separately in Python. Test-only; not installed.
//
// Input: the first line is "CAPACITY FREQUENCY": bytes, then "resident"
// (GdsfFrequency::kResident) or the history's window in requests (0: the
// cache sizes it); then
//   put KEY NBYTES COST     COST in seconds, or "-" for unmeasured
//   get KEY
//   pop KEY
// Output: per operation, "evict KEY" for each victim in hook order, then one
// of "hit KEY" / "miss KEY" (get), "popped KEY" / "absent KEY" (pop), "ok"
// (put); at the end "clock C" with C printed to 17 significant digits.
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>

#include "epd/core/embedding_cache.h"

int main() {
  std::int64_t capacity = 0;
  std::string frequency;
  if (!(std::cin >> capacity >> frequency)) return 2;
  epd::CacheOptions options{epd::EvictionPolicy::kGdsf};
  if (frequency == "resident") {
    options.gdsf_frequency = epd::GdsfFrequency::kResident;
  } else {
    options.gdsf_history_window = std::stoull(frequency);
  }
  epd::EmbeddingCache<std::string, int> cache(
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
  return 0;
}
