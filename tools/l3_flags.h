// tools/l3_flags.h: the shared-tier (L3) flags of every subcommand that runs
// an EncodeWorker (serve, replay), and the one function that
// turns them into WorkerOptions::shared_tier (docs/L3.md).
//
// Flags (defaults in brackets):
//   --l3 URL                   redis://[[user]:password@]host[:port][/db];
//                              repeat for several Redis servers (keys are
//                              spread by consistent hashing) [none: no L3]
//   --l3-ttl-s S               lifetime of a stored embedding, 0 = none [86400]
//   --l3-timeout-ms MS         longest one Redis command may take [50]
//   --l3-lease-ms MS           cluster-wide single-flight lease; 0 turns
//                              single flight off [10000]
//   --l3-wait-ms MS            longest a request waits for another server's
//                              lease before encoding itself [12000]
//   --l3-write-queue-mb MB     embeddings queued for writing at most [256]
//   --l3-threads N             lookup threads (blocking Redis calls) [4]
//   --l3-prefix P              prefix of every Redis key ["epd:"]
//   --l3-key-file PATH         the cluster key file (epd/l3/l3_keyring.h):
//                              values and leases carry a MAC under it, and
//                              what does not authenticate is refused; the
//                              same file on every server [none: values carry
//                              a checksum only, and the tier trusts everyone
//                              who can write to the Redis]
//
// Thread safety: not thread-safe (parse-time helpers).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "epd/core/status.h"
#include "epd/worker/encode_worker.h"

namespace epd::cli {

struct L3Flags {
  std::vector<std::string> urls;
  std::int64_t ttl_s = 86400;
  std::int64_t timeout_ms = 50;
  std::int64_t lease_ms = 10000;
  std::int64_t wait_ms = 12000;
  double write_queue_mb = 256;
  int threads = 4;
  std::string prefix = "epd:";
  std::string key_file;
};

void AddL3Flags(CLI::App& cmd, L3Flags& flags);

// Opens the shared tier into `options.shared_tier` when --l3 is given (no
// connection yet: a Redis that is down makes the server degraded, not
// fail), with `options.preprocess.merge_size` as the merge size values are
// checked against. Errors: kInvalidArgument for a bad URL or value, a key
// file that cannot be read or parsed (epd/l3/l3_keyring.h), or --l3-key-file
// without --l3;
// kFailedPrecondition when this build has no L3 (EPD_WITH_L3=OFF).
Status ApplyL3Flags(const L3Flags& flags, WorkerOptions& options);

}  // namespace epd::cli
