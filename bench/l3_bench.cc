// l3_bench: what an L3 hit costs, by entry size, against an L1 hit.
//
// Starts a redis-server of its own on a free loopback port (persistence off,
// stopped by PID; src/testing/redis_server.h) and talks to it through epd::l3
// (OpenRedisTier), the code the encode server uses. For each entry size
// (0.5, 2 and 8 MiB of embedding bytes by default) it stores one embedding
// and then times, one call at a time:
//   l1_hit     EmbeddingCache::Get of the same embedding (a shared_ptr copy:
//              what an L1 hit costs before the bytes are sent);
//   l3_get     SharedTier::Get: one GET over loopback, the header and XXH3
//              checksum check, and the copy into a fresh host Embedding
//              (what a server pays for an L3 hit before it answers);
//   l3_decode  DecodeL3Value on bytes already in memory (l3_get without the
//              network: the difference is Redis and the socket);
//   l3_encode  EncodeL3Value (the writer thread's cost per tower result);
//   mac_hmac_sha256, mac_gmac
//              HMAC-SHA256 and GMAC (AES-256-GCM, the value as AAD) over the
//              whole value's bytes, one call each (epd/l3/l3_mac.h): the
//              measurement behind the choice of GMAC for values (docs/L3.md);
//   l3_get_keyed, l3_decode_keyed, l3_encode_keyed
//              the same three with a cluster keyring (format 2: GMAC instead
//              of XXH3, checked in the same pass as the copy);
//   l3_put     PutAsync until a Get finds the value (the write's latency as
//              another server sees it; polled every 100 us, so it includes
//              up to that plus one Get).
// Each is reported as p50/p90/p99/mean in microseconds over --samples calls,
// after --warmup untimed ones.
//
// Output: one JSON object (schema "epd-bench-l3/1") on stdout or --out; the
// figures are rendered by bench/report.py (section "L3") with the cluster
// figures of bench/cluster_bench.py.
//
// Usage: l3_bench [--redis-server PATH] [--out FILE] [--samples N] [--warmup N]
//                 [--sizes-mib 0.5,2,8] [--hidden 512] [--deepstack 1]

#include <malloc.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "epd/core/embedding.h"
#include "epd/core/embedding_cache.h"
#include "epd/core/shared_tier.h"
#include "epd/l3/l3_mac.h"
#include "epd/l3/l3_value.h"
#include "epd/l3/redis_tier.h"
#include "epd/media/content_key.h"
#include "testing/redis_server.h"

namespace epd {
namespace {

using Clock = std::chrono::steady_clock;

struct Flags {
  std::string redis_server = "redis-server";
  std::string out;
  int samples = 200;
  int warmup = 20;
  std::vector<double> sizes_mib = {0.5, 2, 8};
  std::int64_t hidden = 512;
  std::int64_t deepstack = 1;
};

// std::exit's work that matters here (flushing stdio), then std::_Exit:
// std::exit runs atexit handlers and static destructors while the tiers'
// threads may still run (concurrency-mt-unsafe).
[[noreturn]] void Exit(int code) {
  std::fflush(nullptr);
  std::_Exit(code);
}

[[noreturn]] void Usage(const std::string& why) {
  std::fprintf(stderr,
               "l3_bench: %s\nusage: l3_bench [--redis-server PATH] [--out FILE] [--samples N] [--warmup N] "
               "[--sizes-mib 0.5,2,8] [--hidden N] [--deepstack N]\n",
               why.c_str());
  Exit(2);
}

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--redis-server") {
      f.redis_server = value();
    } else if (a == "--out") {
      f.out = value();
    } else if (a == "--samples") {
      f.samples = std::atoi(value().c_str());
    } else if (a == "--warmup") {
      f.warmup = std::atoi(value().c_str());
    } else if (a == "--hidden") {
      f.hidden = std::atoll(value().c_str());
    } else if (a == "--deepstack") {
      f.deepstack = std::atoll(value().c_str());
    } else if (a == "--sizes-mib") {
      f.sizes_mib.clear();
      std::stringstream ss(value());
      for (std::string part; std::getline(ss, part, ',');) f.sizes_mib.push_back(std::atof(part.c_str()));
    } else {
      Usage("unknown argument '" + a + "'");
    }
  }
  if (f.redis_server.find('/') == std::string::npos) {
    // RedisServer execs a path: look the name up on PATH.
    const char* path =
        std::getenv("PATH");  // NOLINT(concurrency-mt-unsafe): read once at startup before any thread starts
    std::stringstream dirs(path != nullptr ? path : "/usr/bin:/bin");
    for (std::string dir; std::getline(dirs, dir, ':');) {
      const std::string candidate = dir + "/" + f.redis_server;
      if (access(candidate.c_str(), X_OK) == 0) {
        f.redis_server = candidate;
        break;
      }
    }
  }
  if (f.samples < 10) Usage("--samples must be >= 10");
  if (f.warmup < 0) Usage("--warmup must be >= 0");
  if (f.hidden <= 0 || f.deepstack < 0) Usage("--hidden must be > 0 and --deepstack >= 0");
  for (double s : f.sizes_mib) {
    if (!(s > 0) || s > 256) Usage("--sizes-mib: each size must be in (0, 256]");
  }
  return f;
}

// A host embedding of `tokens` rows with reproducible, non-constant bytes.
std::shared_ptr<Embedding> MakeEmbedding(std::int64_t tokens, std::int64_t hidden, std::int64_t deepstack,
                                         std::uint32_t seed) {
  auto e = std::make_shared<Embedding>();
  e->tokens = tokens;
  e->hidden = hidden;
  e->deepstack_layers = deepstack;
  e->dtype = DType::kFloat32;
  e->grid = {1, 2, 2 * tokens};
  e->main.resize(e->main_bytes());
  e->deepstack.resize(e->deepstack_bytes());
  std::mt19937 rng(seed);
  for (auto* v : {&e->main, &e->deepstack}) {
    for (std::size_t i = 0; i < v->size(); i += 4) {
      const float x = static_cast<float>(rng() % 2001) / 1000.0f - 1.0f;
      std::memcpy(v->data() + i, &x, 4);
    }
  }
  return e;
}

ContentKey KeyFor(std::uint32_t n) {
  ContentKey k;
  std::mt19937 rng(0x13 + n);
  for (auto& b : k.bytes) b = static_cast<std::uint8_t>(rng());
  return k;
}

struct Summary {
  double p50 = 0, p90 = 0, p99 = 0, mean = 0;
  int n = 0;
};

// Nearest-rank percentiles of microsecond samples.
Summary Summarize(std::vector<double> us) {
  Summary s;
  std::sort(us.begin(), us.end());
  s.n = static_cast<int>(us.size());
  auto rank = [&](double p) {
    std::size_t i = static_cast<std::size_t>(std::ceil(p * static_cast<double>(us.size()))) - 1;
    return us[std::min(i, us.size() - 1)];
  };
  s.p50 = rank(0.50);
  s.p90 = rank(0.90);
  s.p99 = rank(0.99);
  double sum = 0;
  for (double v : us) sum += v;
  s.mean = sum / static_cast<double>(us.size());
  return s;
}

template <typename F>
Summary Time(int warmup, int samples, F&& f) {
  for (int i = 0; i < warmup; ++i) f();
  std::vector<double> us;
  us.reserve(samples);
  for (int i = 0; i < samples; ++i) {
    const auto t0 = Clock::now();
    f();
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  return Summarize(std::move(us));
}

std::string Json(const Summary& s) {
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "{\"p50_us\": %.2f, \"p90_us\": %.2f, \"p99_us\": %.2f, \"mean_us\": %.2f, \"n\": %d}", s.p50, s.p90,
                s.p99, s.mean, s.n);
  return buf;
}

// The redis-server child, so that no way out leaves it running: Die and
// SIGINT/SIGTERM kill it by PID (a destructor does not run on those paths).
volatile pid_t g_redis_pid = -1;

void KillRedisAndExit(int sig) {
  if (g_redis_pid > 0) ::kill(g_redis_pid, SIGKILL);
  ::_exit(128 + sig);
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "l3_bench: %s\n", what.c_str());
  if (g_redis_pid > 0) ::kill(g_redis_pid, SIGKILL);
  Exit(1);
}

// Stores `e` under `key` through `tier`, waits until a Get finds it, then
// times Gets of it.
Summary StoreAndTimeGet(SharedTier& tier, const ContentKey& key, const std::shared_ptr<Embedding>& e, int warmup,
                        int samples) {
  tier.PutAsync(key, e);
  for (int tries = 0;; ++tries) {
    StatusOr<EmbeddingPtr> g = tier.Get(key);
    if (g.ok() && *g) break;
    if (tries > 100000) Die("the value never appeared in Redis");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return Time(warmup, samples, [&] {
    StatusOr<EmbeddingPtr> g = tier.Get(key);
    if (!g.ok() || !*g) Die("Get missed a stored value: " + (g.ok() ? std::string("miss") : g.status().ToString()));
    if ((*g)->nbytes() != e->nbytes() || std::memcmp((*g)->main.data(), e->main.data(), 64) != 0) {
      Die("Get returned other bytes");
    }
  });
}

int Run(int argc, char** argv) {
  const Flags f = ParseFlags(argc, argv);
  // As `epd-encode serve` does (TuneMalloc, tools/cli_util.h): keep blocks
  // under 32 MB in the heap instead of a fresh mmap (and munmap) per block.
  // Without it every Get of a 2 MB value maps, faults in and unmaps several
  // 2 MB blocks (hiredis's reply buffer, the reply string, the embedding),
  // and on this loaded 2-core machine a 2 MB Get measured p50 217 ms instead
  // of 4.8 ms (same build, same minute).
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // NOLINT(concurrency-mt-unsafe): before the bench starts a thread
  mallopt(M_TRIM_THRESHOLD, 64 << 20);  // NOLINT(concurrency-mt-unsafe): likewise
  test_util::RedisServer redis(f.redis_server);
  g_redis_pid = redis.pid();
  // sigaction, not std::signal (whose semantics vary and which clang-tidy
  // counts as not thread-safe).
  struct sigaction on_signal {};
  on_signal.sa_handler = KillRedisAndExit;
  sigemptyset(&on_signal.sa_mask);
  sigaction(SIGINT, &on_signal, nullptr);
  sigaction(SIGTERM, &on_signal, nullptr);
  std::string version = redis.Cli({"INFO", "server"});
  if (auto p = version.find("redis_version:"); p != std::string::npos) {
    version = version.substr(p + 14, version.find('\r', p) - p - 14);
  } else {
    version = "unknown";
  }

  RedisTierOptions o;
  o.urls = {redis.url()};
  o.timeout = std::chrono::milliseconds(2000);  // measure, do not give up
  o.ttl = std::chrono::seconds(0);
  o.max_write_queue_bytes = std::int64_t{1} << 30;
  StatusOr<std::shared_ptr<SharedTier>> opened = OpenRedisTier(o);
  if (!opened.ok()) Die("OpenRedisTier: " + opened.status().ToString());
  std::shared_ptr<SharedTier> tier = *opened;
  // A fixed test key: the bench measures cost, not secrecy.
  L3Secret secret;
  secret.fill(0x5c);
  const std::shared_ptr<const L3Keyring> ring = *L3Keyring::FromSecrets(1, secret);
  o.keyring = ring;
  o.key_prefix = "epd-keyed:";
  StatusOr<std::shared_ptr<SharedTier>> opened_keyed = OpenRedisTier(o);
  if (!opened_keyed.ok()) Die("OpenRedisTier (keyed): " + opened_keyed.status().ToString());
  std::shared_ptr<SharedTier> keyed_tier = *opened_keyed;

  const std::int64_t row_bytes = f.hidden * (1 + f.deepstack) * 4;
  std::ostringstream rows;
  std::uint32_t key_n = 0;
  for (double mib : f.sizes_mib) {
    const std::int64_t tokens =
        std::max<std::int64_t>(1, static_cast<std::int64_t>(mib * (1 << 20) / static_cast<double>(row_bytes)));
    std::shared_ptr<Embedding> e = MakeEmbedding(tokens, f.hidden, f.deepstack, key_n);
    const ContentKey key = KeyFor(key_n++);
    const int samples = mib > 4 ? std::max(10, f.samples / 2) : f.samples;

    // L1: the cache the worker owns, holding this one entry.
    EmbeddingCache<ContentKey, EmbeddingPtr, ContentKeyHash> l1(std::int64_t{1} << 30);
    l1.Put(key, e, static_cast<std::int64_t>(e->nbytes()));
    EmbeddingPtr sink;
    const Summary l1_hit = Time(f.warmup * 10, samples * 10, [&] { sink = *l1.Get(key); });

    const std::string value = EncodeL3Value(key, *e, kContentKeyVersion);
    const Summary encode = Time(f.warmup, samples, [&] {
      std::string v = EncodeL3Value(key, *e, kContentKeyVersion);
      if (v.size() != value.size()) Die("EncodeL3Value size changed");
    });
    const Summary decode = Time(f.warmup, samples, [&] {
      StatusOr<EmbeddingPtr> d = DecodeL3Value(value, key, kContentKeyVersion);
      if (!d.ok()) Die("DecodeL3Value: " + d.status().ToString());
    });

    // The write as another server sees it: PutAsync, then Get until found.
    std::uint32_t put_n = 1000000 + key_n * 10000;
    const Summary put = Time(std::min(f.warmup, 5), std::max(10, samples / 4), [&] {
      const ContentKey k = KeyFor(put_n++);
      tier->PutAsync(k, e);
      for (int tries = 0;; ++tries) {
        StatusOr<EmbeddingPtr> g = tier->Get(k);
        if (g.ok() && *g) break;
        if (tries > 200000) Die("PutAsync: the value never appeared");
        // Not a busy loop: polling flat out would take the writer thread's
        // and Redis's CPU on a small machine and slow the write it waits for.
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    });

    const Summary get = StoreAndTimeGet(*tier, key, e, f.warmup, samples);
    const ContentKey keyed_key = KeyFor(2000000 + key_n);
    const Summary get_keyed = StoreAndTimeGet(*keyed_tier, keyed_key, e, f.warmup, samples);

    L3ValueOptions keyed;
    keyed.keyring = ring;
    const std::string keyed_value = EncodeL3Value(key, *e, kContentKeyVersion, keyed);
    const Summary encode_keyed = Time(f.warmup, samples, [&] {
      std::string v = EncodeL3Value(key, *e, kContentKeyVersion, keyed);
      if (v.size() != keyed_value.size()) Die("EncodeL3Value size changed");
    });
    const Summary decode_keyed = Time(f.warmup, samples, [&] {
      StatusOr<EmbeddingPtr> d = DecodeL3Value(keyed_value, key, kContentKeyVersion, keyed);
      if (!d.ok()) Die("DecodeL3Value (keyed): " + d.status().ToString());
    });
    // The two MACs over the same bytes (the keyed value's), nothing else.
    std::uint8_t tag_sink = 0;
    const Summary hmac = Time(f.warmup, samples, [&] {
      HmacSha256 m(ring->current().lease_key);
      m.Update(keyed_value.data(), keyed_value.size());
      tag_sink ^= (*m.Final())[0];
    });
    const Summary gmac = Time(f.warmup, samples, [&] {
      Gmac m(ring->current().value_key, Gmac::Iv{});
      m.Update(keyed_value.data(), keyed_value.size());
      tag_sink ^= (*m.Final())[0];
    });
    [[maybe_unused]] volatile std::uint8_t keep = tag_sink;  // keeps the tags alive
    // Free Redis memory before the next size.
    redis.Cli({"FLUSHALL"});

    if (rows.tellp() > 0) rows << ",\n";
    rows << "    {\"mib\": " << mib << ", \"bytes\": " << e->nbytes() << ", \"value_bytes\": " << value.size()
         << ", \"tokens\": " << tokens << ",\n     \"l1_hit\": " << Json(l1_hit) << ",\n     \"l3_get\": " << Json(get)
         << ",\n     \"l3_decode\": " << Json(decode) << ",\n     \"l3_encode\": " << Json(encode)
         << ",\n     \"l3_put_visible\": " << Json(put) << ",\n     \"l3_get_keyed\": " << Json(get_keyed)
         << ",\n     \"l3_decode_keyed\": " << Json(decode_keyed)
         << ",\n     \"l3_encode_keyed\": " << Json(encode_keyed) << ",\n     \"mac_hmac_sha256\": " << Json(hmac)
         << ",\n     \"mac_gmac\": " << Json(gmac) << "}";
    std::fprintf(stderr,
                 "%.1f MiB: L1 hit p50 %.2f us; L3 get p50 %.0f us p99 %.0f us (keyed %.0f / %.0f); decode p50 %.0f us "
                 "(keyed %.0f); HMAC-SHA256 p50 %.0f us, GMAC p50 %.0f us\n",
                 mib, l1_hit.p50, get.p50, get.p99, get_keyed.p50, get_keyed.p99, decode.p50, decode_keyed.p50,
                 hmac.p50, gmac.p50);
  }
  const SharedTierStats st = tier->Stats();
  std::ostringstream out;
  out << "{\n  \"schema\": \"epd-bench-l3/1\",\n  \"redis_version\": \"" << version << "\",\n  \"hidden\": " << f.hidden
      << ",\n  \"deepstack_layers\": " << f.deepstack << ",\n  \"dtype\": \"float32\",\n  \"samples\": " << f.samples
      << ",\n  \"tier_errors\": " <<
      [&] {
        std::uint64_t n = 0;
        for (const auto& [k, v] : st.errors) n += v;
        return n;
      }()
      << ",\n  \"sizes\": [\n"
      << rows.str() << "\n  ]\n}\n";
  if (f.out.empty()) {
    std::cout << out.str();
  } else {
    std::ofstream(f.out) << out.str();
  }
  return 0;
}

}  // namespace
}  // namespace epd

int main(int argc, char** argv) { return epd::Run(argc, argv); }
