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
// is written under a temporary name in the id's directory, fsynced, and
// then linked (or renamed) into place.
//
// Content: each file records, in its safetensors "__metadata__" (which
// load_file ignores), the namespaced content key it was made from
// ("epd_content_key": ContentKey::Hex()). A request for an id whose file
// records the same key renews it (mtime) and does not rewrite it; one whose
// key differs (the bytes behind a URL changed, another tenant's item under
// the same uuid, a file from before keys were recorded) replaces it
// atomically (rename(2)): the reply's grid and the file's rows always come
// from the same item.
//
// Tenants: an item published for a tenant (EcItem::tenant, set by the front
// under --tenant-isolation salted) goes to that tenant's own directory,
//   <dir>/tenant=<name>/<id>/encoder_cache.safetensors
// (<name> mapped as ids are), which that tenant's prefill uses as its
// shared_storage_path; the shared namespace (tenant "") keeps <dir>/<id>/.
// With the key check above, a file made for another tenant is never served
// as present even where two tenants' ids meet.
//
// Ids: any string (vLLM accepts any uuid). One that is 1..255 bytes of
// [A-Za-z0-9._-], not starting with '.', is the directory's name as it is;
// any other is mapped to "sha256=" + the hex SHA-256 of its bytes (IdName),
// which the consumer must apply too (docs/VLLM.md). No id names anything
// outside its namespace's directory.
//
// Symlinks and other files: every operation is relative to the ec-dir's
// directory descriptor (opened at Open: the configured path itself may be
// a symlink) and follows no symlink inside it (O_NOFOLLOW,
// AT_SYMLINK_NOFOLLOW). A symlink or non-directory where an id's (or a
// tenant's) directory should be fails the publish (kInternal, below); a
// symlink, FIFO or anything but a regular file where the file should be is
// never present, and is replaced. The start-time scan counts regular files
// in real directories only, so eviction never deletes outside <dir>.
//
// Modes: files 0640 and directories 0750 whatever the umask, in
// `group` when one is set (the prefill's group); the ec-dir itself, when
// Open creates it, 0750 in that group too.
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
// Errors of Publish: kInvalidArgument for an embedding whose bytes disagree
// with its shape; kInternal "ec_dir_write_failed: ..." naming the path and
// the system's reason when the file cannot be written (ENOSPC, EACCES, a
// file or a symlink where the id's directory should be): nothing is left
// behind (no temporary, no directory this publish created) and the
// publisher goes on. Open: kInvalidArgument for an empty dir or an unknown
// group (or one the server's user is not in), kInternal when the dir cannot
// be created or opened.
//
// Ownership: the publisher owns the ec-dir's descriptor; files on disk
// belong to the directory (the bound deletes them, the publisher's
// destruction does not).
// Thread safety: thread-safe; Publish calls for different ids write in
// parallel (the index is locked only to record and evict).
// Complexity: Publish O(bytes) (a present file: O(its header)) + O(log
// files) per eviction; Open O(files in <dir>).
//
// Example:
//   auto ec = epd::EcPublisher::Open({.dir = "/dev/shm/ec", .group = "vllm"});
//   (*ec)->Publish({.id = "user:42", .key = result.key.Hex()}, **host);
//   // -> /dev/shm/ec/sha256=<hex of "user:42">/encoder_cache.safetensors
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
  // The group of what is published: a group name or a numeric gid,
  // resolved at Open; "" = the server's own (its primary group, or the
  // ec-dir's when that directory is set-group-ID).
  std::string group{};
};

// What an item is published as.
struct EcItem {
  std::string id;  // the request's uuid (any string) or the content key's hex
  // The namespaced content key the embedding was made from
  // (ContentKey::Hex()); recorded in the file, compared on a re-request.
  std::string key;
  // "" = the shared namespace (<dir>/<id>/); else the tenant whose
  // directory <dir>/tenant=<name>/ holds the item.
  std::string tenant{};
};

struct EcPublisherStats {
  std::uint64_t published = 0;        // files written
  std::uint64_t already_present = 0;  // requests for an id whose file held the same key (not rewritten)
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

  // The path component of an id: itself, or "sha256=" + hex SHA-256 of it
  // (see the header comment). Pure; O(id size).
  static std::string IdName(std::string_view id);
  // The directory of `tenant`'s ids, relative to <dir>: "" for the shared
  // namespace, else "tenant=" + IdName(tenant).
  static std::string TenantDir(std::string_view tenant);
  // <dir>[/<TenantDir(tenant)>]/<IdName(id)>/encoder_cache.safetensors
  std::string PathOf(std::string_view id, std::string_view tenant = {}) const;
  // Writes the item's file unless the file there records item.key (then
  // renews it). REQUIRES: `e` is on the host (epd::ToHost).
  StatusOr<EcOutcome> Publish(const EcItem& item, const Embedding& e);
  EcPublisherStats Stats() const;

  struct Impl;

 private:
  explicit EcPublisher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace epd
