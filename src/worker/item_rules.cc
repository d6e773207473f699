// Item rules (item_rules.h). Why the queue bound counts jobs rather than
// items: a duplicate or a joined item adds no tower work, so only keys that
// would become new jobs count; a request whose new jobs alone exceed the
// bound is the request's fault (it could never be admitted, however long the
// caller waits), one that only overflows the current load is the load's.
#include "item_rules.h"

#include <algorithm>

#include "epd/media/content_key.h"
#include "epd/media/tenant_key.h"
#include "video_items.h"

namespace epd::internal {

std::optional<KeyNamespace> ItemNamespace(const std::optional<KeyNamespace>& ns, const EncodeItemInput& item) {
  if (!ns.has_value() || !item.is_public || !ns->public_allowed) return ns;
  KeyNamespace pub = *ns;
  pub.name = std::string(kPublicNamespace);
  return pub;
}

namespace {

// The item's key moved into its namespace (KeyNamespace); as is without one.
StatusOr<ContentKey> InNamespace(const std::optional<KeyNamespace>& ns, const EncodeItemInput& item,
                                 StatusOr<ContentKey> key) {
  if (!ns.has_value() || !key.ok()) return key;
  return ChunkKeyIn(ItemNamespace(ns, item), *key);
}

StatusOr<ContentKey> ContentKeyOf(const WorkerOptions& o, const EncodeItemInput& item) {
  if (item.is_video()) {
    if (item.caller_key.has_value() || !item.media.empty()) {
      return InvalidArgument(
          "a video item carries image bytes or a caller_key; a video is keyed by its own bytes and sampling");
    }
    return VideoItemKey(o, *item.video);
  }
  if (item.caller_key.has_value()) return CallerContentKey(o.model_id, o.preprocess, *item.caller_key);
  return ComputeContentKey(o.model_id, o.preprocess, item.media.span(), o.key_mode);
}

}  // namespace

// The one place a request's namespace is applied (KeyNamespace).
std::vector<StatusOr<ContentKey>> KeysFor(const WorkerOptions& o, const EncodeRequest& request) {
  std::vector<StatusOr<ContentKey>> keys;
  keys.reserve(request.items.size());
  for (const EncodeItemInput& item : request.items) {
    keys.push_back(InNamespace(request.key_namespace, item, ContentKeyOf(o, item)));
  }
  return keys;
}

ContentKey ChunkKeyIn(const std::optional<KeyNamespace>& ns, const ContentKey& key) {
  if (!ns.has_value()) return key;
  const std::string& secret = *ns->secret;
  return NamespacedContentKey({reinterpret_cast<const std::uint8_t*>(secret.data()), secret.size()}, ns->name, key);
}

const StatusOr<ProbedGrid>& HeaderProbe::Get() {
  if (!probed_.has_value()) probed_.emplace(ProbeGrid(media_.span(), options_.preprocess, options_.limits));
  return *probed_;
}

Status CheckExpectedTokensSign(std::int64_t expected) {
  if (expected >= 0) return Status::Ok();
  return InvalidArgument("expected_tokens is " + std::to_string(expected) + "; it must be >= 0 (0 = unknown)");
}

Status CheckExpectedTokens(std::int64_t expected, std::string_view what, const GridTHW& g, std::int64_t merge_size) {
  const std::int64_t tokens = g.tokens(merge_size);
  if (expected == 0 || expected == tokens) return Status::Ok();
  return InvalidArgument("expected_tokens is " + std::to_string(expected) + " but " + std::string(what) + " gives " +
                         std::to_string(tokens) + " tokens (grid " + std::to_string(g.t) + "x" + std::to_string(g.h) +
                         "x" + std::to_string(g.w) + ", merge " + std::to_string(merge_size) + ")");
}

Status CheckImageExpectedTokens(const EncodeItemInput& item, HeaderProbe& header, std::int64_t merge_size) {
  if (Status s = CheckExpectedTokensSign(item.expected_tokens); !s.ok()) return s;
  if (item.expected_tokens == 0 || item.media.empty()) return Status::Ok();
  const StatusOr<ProbedGrid>& probed = header.Get();
  if (!probed.ok()) return Status::Ok();
  const std::string what =
      "the " + std::to_string(probed->info.width) + "x" + std::to_string(probed->info.height) + " image";
  return CheckExpectedTokens(item.expected_tokens, what, probed->grid, merge_size);
}

std::int64_t ImageTokens(const EncodeItemInput& item, HeaderProbe& header, std::int64_t merge_size) {
  if (item.expected_tokens > 0) return item.expected_tokens;
  const StatusOr<ProbedGrid>& probed = header.Get();
  return probed.ok() ? probed->grid.tokens(merge_size) : 0;
}

QueueBoundSubject RequestSubject(const std::string& request_id) {
  return {"request '" + request_id + "'", "items", "split it into requests of at most that many new images"};
}

QueueBoundSubject VideoSubject() {
  return {"the video", "temporal chunks", "sample fewer frames (max_frames, fps) or split the video"};
}

Status CheckQueueBound(const QueueBoundSubject& who, std::int64_t new_jobs, std::int64_t pending, std::int64_t limit) {
  if (limit == 0) return Status::Ok();
  const std::string n = std::to_string(new_jobs) + " " + std::string(who.unit);
  if (new_jobs > limit) {
    return InvalidArgument(who.subject + " has " + n +
                           " to queue for the tower (neither cached nor in flight), more than the queue holds at "
                           "once (max_pending_items " +
                           std::to_string(limit) + "); " + std::string(who.advice));
  }
  if (pending + new_jobs > limit) {
    return ResourceExhausted(who.subject + " would queue " + n + " on top of " + std::to_string(pending) +
                             " pending; the limit is " + std::to_string(limit) + " (retry later)");
  }
  return Status::Ok();
}

std::int64_t CountNewJobs(std::span<const ContentKey> keys, bool dedup,
                          const std::function<bool(const ContentKey&)>& known) {
  std::int64_t n = 0;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (known(keys[i])) continue;
    if (dedup && std::find(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(i), keys[i]) !=
                     keys.begin() + static_cast<std::ptrdiff_t>(i)) {
      continue;  // counted at its first occurrence
    }
    ++n;
  }
  return n;
}

Status CheckRequestQueueBound(const std::string& request_id, std::span<const StatusOr<ContentKey>> keys, bool dedup,
                              const std::function<bool(const ContentKey&)>& known, std::int64_t pending,
                              std::int64_t limit) {
  if (limit == 0) return Status::Ok();
  std::vector<ContentKey> valid;
  for (const StatusOr<ContentKey>& k : keys) {
    if (k.ok()) valid.push_back(*k);
  }
  return CheckQueueBound(RequestSubject(request_id), CountNewJobs(valid, dedup, known), pending, limit);
}

Status AlreadyInFlight(const std::string& request_id) {
  return AlreadyExists("request '" + request_id + "' is already in flight");
}

std::int64_t FairShareCost(const ImageInfo& info, std::int64_t tokens, const PreprocessConfig& p) {
  const std::int64_t pixels_per_token = p.factor() * p.factor();
  return tokens + std::int64_t{info.width} * info.height / std::max<std::int64_t>(pixels_per_token, 1);
}

// An image stored at about its resized size costs about 2 x its tokens
// (tokens plus as many pixel units), so such batches are bounded by tokens as
// before; an image whose decode dwarfs its tokens (an 8000x8000 PNG: ~83,000
// units for 1,280 tokens) runs in a batch of its own instead of making the
// cheap images batched with it wait for its decode.
std::int64_t FairShareBound(const WorkerOptions& o) {
  return o.order == ScheduleOrder::kFair ? 2 * o.max_tokens_per_batch : 0;
}

}  // namespace epd::internal
