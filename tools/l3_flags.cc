// The shared-tier flags (l3_flags.h). Error lines of the tier go to spdlog
// as warnings; the tier itself rate-limits them (one per distinct error per
// 10 s).
#include "l3_flags.h"

#include <spdlog/spdlog.h>

#include "flag_checks.h"
#ifdef EPD_HAVE_L3
#include "epd/l3/redis_tier.h"
#endif

namespace epd::cli {

void AddL3Flags(CLI::App& cmd, L3Flags& f) {
  cmd.add_option("--l3", f.urls,
                 "shared L3 tier: redis://[[user]:password@]host[:port][/db]; repeat to spread keys over several "
                 "Redis servers; or one redis-cluster://[[user]:password@]host:port[,host:port...] for a Redis "
                 "Cluster (docs/L3.md)");
  cmd.add_option("--l3-ttl-s", f.ttl_s, "lifetime of an L3 entry, seconds; 0 = none")
      ->capture_default_str()
      ->check(Integer(0));
  cmd.add_option("--l3-timeout-ms", f.timeout_ms, "longest one Redis command may take, ms")
      ->capture_default_str()
      ->check(Integer(1, 600000));
  cmd.add_option("--l3-lease-ms", f.lease_ms,
                 "cluster-wide single-flight lease, ms (must exceed one encode); 0 = no single flight")
      ->capture_default_str()
      ->check(Integer(0));
  cmd.add_option("--l3-wait-ms", f.wait_ms, "longest wait for another server's lease before encoding here, ms")
      ->capture_default_str()
      ->check(Integer(0));
  cmd.add_option("--l3-write-queue-mb", f.write_queue_mb, "embeddings queued for writing to L3 at most, MB")
      ->capture_default_str()
      ->check(NonNegative("MB"));
  cmd.add_option("--l3-threads", f.threads, "L3 lookup threads")->capture_default_str()->check(Integer(1, 256));
  cmd.add_option("--l3-prefix", f.prefix, "prefix of every Redis key")->capture_default_str();
  cmd.add_option("--l3-key-file", f.key_file,
                 "cluster key file: L3 values and leases carry a MAC under it; the same file on every server "
                 "(docs/L3.md); without it the L3 tier trusts everyone who can write to the Redis");
}

Status ApplyL3Flags(const L3Flags& f, WorkerOptions& o) {
  if (f.urls.empty()) {
    return f.key_file.empty() ? Status::Ok()
                              : InvalidArgument("--l3-key-file needs --l3 (no shared tier is configured)");
  }
#ifdef EPD_HAVE_L3
  RedisTierOptions r;
  r.urls = f.urls;
  r.ttl = std::chrono::seconds(f.ttl_s);
  r.timeout = std::chrono::milliseconds(f.timeout_ms);
  r.wait.single_flight = f.lease_ms > 0;
  r.lease = std::chrono::milliseconds(f.lease_ms > 0 ? f.lease_ms : 1);
  r.wait.wait = std::chrono::milliseconds(f.wait_ms);
  r.wait.lookup_threads = f.threads;
  r.max_write_queue_bytes = std::max<std::int64_t>(1, static_cast<std::int64_t>(f.write_queue_mb * (1 << 20)));
  r.key_prefix = f.prefix;
  r.merge_size = o.preprocess.merge_size;
  if (!f.key_file.empty()) {
    StatusOr<std::shared_ptr<const L3Keyring>> ring = L3Keyring::Load(f.key_file);
    if (!ring.ok()) return ring.status();
    r.keyring = *std::move(ring);
  }
  const std::string auth = r.keyring != nullptr
                               ? "values and leases authenticated, " + r.keyring->Describe()
                               : "no --l3-key-file: values and leases are trusted from anyone who can write to Redis";
  r.log = [](const std::string& line) { spdlog::warn("{}", line); };
  StatusOr<std::shared_ptr<SharedTier>> tier = OpenRedisTier(std::move(r));
  if (!tier.ok()) return tier.status();
  spdlog::info("L3: {} (single flight {}; {})", (*tier)->Describe(), f.lease_ms > 0 ? "on" : "off", auth);
  o.shared_tier = *std::move(tier);
  return Status::Ok();
#else
  (void)o;
  return FailedPrecondition("--l3: this epd-encode was built without the L3 tier (EPD_WITH_L3=OFF)");
#endif
}

}  // namespace epd::cli
