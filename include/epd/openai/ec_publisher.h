// epd/openai/ec_publisher.h: embeddings published where vLLM's
// ECExampleConnector loads them (docs/VLLM.md).
//
// Layout, as vllm/distributed/ec_transfer/ec_connector/example_connector.py
// reads it (its shared_storage_path is our `dir`):
//   <dir>/<id>/encoder_cache.safetensors
// holding exactly one tensor, "ec_cache", of shape [tokens, width] in the
// embedding's dtype (F32, BF16 or F16), where width = hidden * (1 +
// deepstack_layers): each row is the item's main row followed by its
// deepstack rows, level by level, as vLLM's Qwen3-VL vision tower
// concatenates them (torch.cat([main] + deepstack, dim=1) in
// Qwen3_VisionTransformer.forward) and splits them back before prefill.
// The consumer checks os.path.exists() on the file and then
// safetensors.torch.load_file(); it never sees a partial file because each
// is written under a temporary name in <dir>/<id>/ and linked into place
// (link(2), which fails rather than replace: a complete file already
// present is never rewritten, by us or by a concurrent publisher of the
// same id).
//
// Ids: 1..255 bytes of [A-Za-z0-9._-], not "." or "..", not starting with
// "." (CheckId; kInvalidArgument otherwise): a uuid from a request can name
// nothing outside <dir>.
//
// Bound: with max_bytes > 0 the files this publisher knows (those it found
// in <dir> at Open and those it published since) are kept under max_bytes
// by deleting the least recently published or re-requested first, but never
// one published or re-requested less than `grace` ago: a consumer may be
// between its exists-check and its load. When everything over the bound is
// that young, the directory stays over it until files age (counted in
// over_budget). A re-request of a present file renews it (mtime too, so a
// restart sees the same order).
//
// Errors of Publish: kInvalidArgument for a bad id or an embedding whose
// bytes disagree with its shape; kInternal "ec_dir_write_failed: ..." naming
// the path and the system's reason when the file cannot be written
// (ENOSPC, EACCES, a file where the id's directory should be): nothing is
// left behind and the publisher goes on. Open: kInvalidArgument for an
// empty dir, kInternal when it cannot be created or read.
//
// Thread safety: thread-safe; Publish calls for different ids write in
// parallel (the index is locked only to record and evict).
// Complexity: Publish O(bytes) + O(log files) per eviction.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "epd/core/embedding.h"
#include "epd/core/status.h"

namespace epd {

struct EcPublisherOptions {
  std::string dir;
  std::int64_t max_bytes = 0;  // 0 = unbounded
  std::chrono::milliseconds grace{30000};
  // The clock ages are measured on; null = the system clock (tests inject one).
  std::function<std::chrono::system_clock::time_point()> now{};
};

struct EcPublisherStats {
  std::uint64_t published = 0;        // files written
  std::uint64_t already_present = 0;  // requests for an id whose file was complete (not rewritten)
  std::uint64_t evicted = 0;          // files deleted by the bound
  std::uint64_t evicted_bytes = 0;
  std::uint64_t write_failures = 0;
  std::uint64_t over_budget = 0;  // publishes after which the dir stayed over max_bytes (all within grace)
  std::int64_t files = 0;         // known now (a gauge)
  std::int64_t bytes = 0;         // their size (a gauge)
};

enum class EcOutcome { kWritten, kPresent };

class EcPublisher {
 public:
  static StatusOr<std::unique_ptr<EcPublisher>> Open(EcPublisherOptions options);
  ~EcPublisher();
  EcPublisher(const EcPublisher&) = delete;
  EcPublisher& operator=(const EcPublisher&) = delete;

  static Status CheckId(std::string_view id);
  // <dir>/<id>/encoder_cache.safetensors
  std::string PathOf(const std::string& id) const;
  // `e` must be on the host (epd::ToHost).
  StatusOr<EcOutcome> Publish(const std::string& id, const Embedding& e);
  EcPublisherStats Stats() const;

  struct Impl;

 private:
  explicit EcPublisher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace epd
