// src/worker/item_rules.h (internal to epd::worker): the rules the worker
// applies to an item before it touches any state: its content key, its
// header probe, the expected-tokens rule, the queue bound, the fair-share
// cost, and the request-level "already in flight" refusal. Each rule and its
// message is written here once and used by images and videos alike (and by
// WorkerLoop's shared-tier parking for "already in flight").
//
// Thread safety: the free functions are pure and thread-safe; a HeaderProbe
// is thread-compatible (one item's, on one thread).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "epd/core/content_key_type.h"
#include "epd/core/grid.h"
#include "epd/core/status.h"
#include "epd/media/image.h"
#include "epd/media/preprocess.h"
#include "epd/worker/encode_request.h"
#include "epd/worker/worker_options.h"

namespace epd::internal {

// The content key of every item of `request` (images: CallerContentKey or
// ComputeContentKey over the bytes; videos: VideoItemKey), or why there is
// none (an empty caller key, a video carrying image bytes), each moved into
// the request's KeyNamespace when it has one (NamespacedContentKey: the one
// place tenant isolation is applied; everything downstream sees only the
// namespaced key). O(bytes hashed).
std::vector<StatusOr<ContentKey>> KeysFor(const WorkerOptions& options, const EncodeRequest& request);
// The namespace an item's keys go to: the request's `ns`, or "public" for an
// item marked public where `ns` allows it. A video's temporal chunks are
// keyed in its item's namespace too.
std::optional<KeyNamespace> ItemNamespace(const std::optional<KeyNamespace>& ns, const EncodeItemInput& item);
// A temporal chunk's key moved into `ns` (NamespacedContentKey); as is
// without one. The chunk-key counterpart of KeysFor's rule.
ContentKey ChunkKeyIn(const std::optional<KeyNamespace>& ns, const ContentKey& key);

// An item's header grid (ProbeGrid), probed at most once per item. `media`
// and `options` must outlive the probe.
class HeaderProbe {
 public:
  HeaderProbe(const MediaBytes& media, const WorkerOptions& options) : media_(media), options_(options) {}
  const StatusOr<ProbedGrid>& Get();

 private:
  const MediaBytes& media_;
  const WorkerOptions& options_;
  std::optional<StatusOr<ProbedGrid>> probed_;
};

// The expected-tokens rule (EncodeItemInput::expected_tokens): OK when
// `expected` is 0 (unknown) or equals `tokens`, the count that `what` ("the
// 56x56 image", "the video") gives with grid `grid` and merge `merge_size`;
// else kInvalidArgument saying both. Negative `expected`: see
// CheckExpectedTokensSign.
Status CheckExpectedTokens(std::int64_t expected, std::string_view what, const GridTHW& grid, std::int64_t merge_size);
// kInvalidArgument for a negative expected_tokens (0 means unknown).
Status CheckExpectedTokensSign(std::int64_t expected);
// An image item's rule: the sign, then, when its header reads, the count it
// gives. An unreadable header passes (the miss path names the decode error).
Status CheckImageExpectedTokens(const EncodeItemInput& item, HeaderProbe& header, std::int64_t merge_size);
// Tokens a hit must have for an image item: expected_tokens when > 0, else
// the header's count, else 0 (unknown: a caller key sent without media).
std::int64_t ImageTokens(const EncodeItemInput& item, HeaderProbe& header, std::int64_t merge_size);

// Who a queue-bound refusal names: "request 'a'" and "items", or "the
// video" and "temporal chunks", with the advice for a load that can never
// fit.
struct QueueBoundSubject {
  std::string subject;
  std::string_view unit;
  std::string_view advice;
};
QueueBoundSubject RequestSubject(const std::string& request_id);
QueueBoundSubject VideoSubject();
// The queue bound (WorkerOptions::max_pending_items, 0 = none): adding
// `new_jobs` on top of `pending` jobs. kInvalidArgument when new_jobs alone
// exceed the limit (it can never be admitted), kResourceExhausted (retry
// later) when the sum does, else OK.
Status CheckQueueBound(const QueueBoundSubject& who, std::int64_t new_jobs, std::int64_t pending, std::int64_t limit);
// How many of `keys` would become new tower jobs, for the queue bound: those
// not `known` (cached, or in flight with dedup), each counted once with
// dedup (a duplicate joins the first). O(keys^2) with dedup.
std::int64_t CountNewJobs(std::span<const ContentKey> keys, bool dedup,
                          const std::function<bool(const ContentKey&)>& known);
// The queue bound for request `request_id` whose items have `keys` (the
// failed keys add no job; a video counts as one job, its chunks being known
// only once decoded): CheckQueueBound of CountNewJobs over the valid keys.
Status CheckRequestQueueBound(const std::string& request_id, std::span<const StatusOr<ContentKey>> keys, bool dedup,
                              const std::function<bool(const ContentKey&)>& known, std::int64_t pending,
                              std::int64_t limit);

// kAlreadyExists: a request with this id is still in flight (in the worker
// or parked for the shared tier).
Status AlreadyInFlight(const std::string& request_id);

// What a miss costs its tenant under kFair: its post-merge tokens (the
// tower's work) plus its stored pixels in token-sized units (decode and
// resize work, which for a huge image dwarfs the tower's).
std::int64_t FairShareCost(const ImageInfo& info, std::int64_t tokens, const PreprocessConfig& p);
// kFair's bound on a batch's share costs (JobScheduler's max_share_per_batch):
// twice the token budget; 0 (none) for the other orders.
std::int64_t FairShareBound(const WorkerOptions& o);

}  // namespace epd::internal
