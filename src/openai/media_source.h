// src/openai/media_source.h (internal): the bytes a media part's URL names.
//
//   data:<type>;base64,<payload>  decoded (OpenSSL's base64 decoder,
//                                 whitespace allowed); a data URL that is
//                                 not base64, or bad base64: kInvalidArgument
//   http:// https://              fetched by MediaFetcher (epd/http/
//                                 media_fetch.h: domains, the resolved
//                                 address of every hop, size, time, redirects)
//   file:///path                  only with an allowed local media path: the
//                                 path, percent-decoded, is resolved with
//                                 realpath(3) (so a symlink cannot lead
//                                 outside) and must lie under that
//                                 directory's own realpath; otherwise
//                                 kPermissionDenied (outside, or no allowed
//                                 path) or kNotFound. It must be a regular
//                                 file: a FIFO, socket, device or directory
//                                 is kPermissionDenied naming what it is,
//                                 checked by lstat before it is opened and by
//                                 fstat on the descriptor (opened O_NONBLOCK,
//                                 beneath the directory with no symlink on
//                                 the way: openat2 RESOLVE_BENEATH |
//                                 RESOLVE_NO_SYMLINKS; the same inode)
//                                 before any read, so no such file ever
//                                 blocks a thread
//   anything else                 kInvalidArgument
// Schemes are case-insensitive ("HTTP://", "Data:", "FILE://"). A URL that
// is not valid UTF-8 (e.g. cut mid-character) is kInvalidArgument; every
// message that echoes a URL or path is valid UTF-8 (MediaUrlForMessage).
// Every source is bounded by max_bytes (kResourceExhausted past it: for a
// data URL, before decoding).
//
// Two ways to resolve:
//   Resolve(url)     synchronous, on the calling thread, no budget.
//   ResolveAll(...)  one request's URLs, in parallel on MediaSource's fetch
//                    threads, under the request's ResolveOptions; returns at
//                    once, and `done` gets the results.
//
// ResolveAll, in detail:
//   Threads: the fetch pool holds at most `fetch_threads` threads (Create),
//     started as needed. A request has at most `parallelism` items in flight;
//     the rest wait behind its own, and requests take turns on the pool
//     (each finished item goes to the back of the queue). Nothing runs on
//     the caller's thread, data: and file:// items included.
//   done: called exactly once, on a fetch thread, when every item has its
//     result, or when the first failure (an item's error, the deadline, the
//     cancel flag, a refused charge) has ended the rest: the failure stops
//     the siblings in flight (their transfers abort) and the items not yet
//     started are not started. done runs after every fetch of the request
//     has returned, so no charge comes after it. It must not throw (a throw
//     is caught and dropped) and may call ResolveAll again.
//   charge: called with each piece of bytes the request comes to hold (a
//     body's pieces as they arrive; a data: item's decoded size; a file's
//     size before it is read). Calls for one request are serialized, never
//     concurrent, on fetch threads. A non-OK status fails that item with
//     it. MediaSource never uncharges: the caller releases
//     ResolvedMedia::charged_bytes when it drops the results.
//   cancel: when *cancel becomes true, transfers abort within about a
//     second and their connections close; items end kCancelled "the client
//     went away".
//   Destroying the MediaSource stops every request in flight (its items end
//     kCancelled) and calls each pending `done` before it returns.
//
// Thread safety: Resolve and ResolveAll are thread-safe.
// Ownership: ResolveAll takes the URLs and options; the results are moved
// into `done`.
//
// Example:
//   ResolveOptions o{.deadline = Clock::now() + 10s, .cancel = gone,
//                    .charge = [budget](int64_t n) { return budget->Take(n); }};
//   media->ResolveAll(urls, o, [=](ResolvedMedia r) {
//     if (r.failed) return Answer(*r.failed, r.items[*r.failed].status());
//     ... r.items[i] holds item i's bytes; release r.charged_bytes later ...
//   });
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "epd/core/mutex.h"
#include "epd/core/status.h"
#include "epd/http/media_fetch.h"

namespace epd::internal {

class FetchPool;

// How one request's URLs are resolved (ResolveAll).
struct ResolveOptions {
  // Absolute, shared by every item of the request: an item in flight when
  // it passes ends kDeadlineExceeded, and so does the resolve.
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  // Items of this request in flight at once; values < 1 count as 1.
  int parallelism = 4;
  // The client went away when *cancel is true. Null = never.
  std::shared_ptr<const std::atomic<bool>> cancel{};
  // Bytes the request comes to hold (see the header comment). Empty = none.
  std::function<Status(std::int64_t more_bytes)> charge{};
};

// What ResolveAll hands to `done`.
struct ResolvedMedia {
  // One per URL, in the URLs' order. After a failure, the items it stopped
  // are kCancelled "not resolved: item N failed first" (or their own error
  // if they failed on their own while stopping).
  std::vector<StatusOr<std::string>> items{};
  // The item whose failure ended the resolve (the first to fail in time);
  // nullopt when every item is OK.
  std::optional<std::size_t> failed{};
  // The sum of the bytes `charge` accepted, to release with the results.
  std::int64_t charged_bytes = 0;
};

// True when `url` is fetched over the network (http:// or https://, in any
// case): the media a request fetches rather than resolves where it arrives.
bool IsHttpUrl(const std::string& url);

class MediaSource {
 public:
  // kInvalidArgument when allowed_local_path is set but not a directory.
  // fetch_threads bounds the fetch pool's threads (values < 1 count as 1).
  static StatusOr<std::unique_ptr<MediaSource>> Create(MediaFetchOptions fetch, const std::string& allowed_local_path,
                                                       int fetch_threads = 16);
  ~MediaSource();
  MediaSource(const MediaSource&) = delete;
  MediaSource& operator=(const MediaSource&) = delete;

  // Stops every ResolveAll in flight (a server stopping): their fetches
  // abort, their items end kCancelled "stopped", and their `done` runs.
  // Later calls are not affected. Thread-safe.
  void StopAll();

  // One URL's bytes, on the calling thread, with no deadline but the
  // fetch's own timeout, no cancel and no charge.
  StatusOr<std::string> Resolve(const std::string& url) const;

  using ResolveDone = std::function<void(ResolvedMedia)>;
  // Resolves `urls` in parallel on the fetch pool; returns at once. See the
  // header comment. An empty `urls` gets done({}) on a fetch thread.
  void ResolveAll(std::vector<std::string> urls, ResolveOptions options, ResolveDone done);

  struct Batch;  // one ResolveAll call (media_source.cc)

 private:
  MediaSource();
  StatusOr<std::string> ResolveOne(const std::string& url, const FetchControl& control) const;
  StatusOr<std::string> FromData(const std::string& url, const FetchControl& control) const;
  StatusOr<std::string> FromFile(const std::string& url, const FetchControl& control) const;
  StatusOr<std::string> ItemOf(Batch& b, std::size_t i) const;
  void Step(const std::shared_ptr<Batch>& b);
  void Finish(Batch& b);

  std::unique_ptr<MediaFetcher> fetcher_;
  std::int64_t max_bytes_ = 0;
  std::string local_root_;  // realpath, "" = file:// off
  int root_fd_ = -1;        // local_root_ (O_PATH), what file:// paths are opened beneath
  Mutex batches_mu_;
  std::unordered_set<Batch*> batches_;  // in flight; stopped on destruction
  std::unique_ptr<FetchPool> pool_;     // last: destroyed first, draining every batch
};

}  // namespace epd::internal
