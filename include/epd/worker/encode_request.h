// epd/worker/encode_request.h: what a caller hands the encode worker: one
// request's images and videos (EncodeRequest, EncodeItemInput, VideoInput)
// and the shared byte buffers that carry them (MediaBytes).
//
// These need media's VideoSampling, so they live in the worker layer rather
// than beside the result types in epd/core/encode_types.h. How the worker
// serves them: epd/worker/encode_worker.h.
//
// Thread safety: value types, thread-compatible; MediaBytes is immutable and
// may be shared across threads.
//
// Example:
//   epd::EncodeRequest r{"req-1", {}};
//   r.items.push_back({.media = jpeg_bytes, .expected_tokens = 324});
//   r.items.emplace_back().video = epd::VideoInput{.container = mp4_bytes};
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "epd/core/embedding.h"
#include "epd/media/video.h"

namespace epd {

// An image's encoded bytes, held behind a shared pointer so that requests
// naming the same file (replay's trace, a caller re-sending an image) share
// one buffer instead of a copy each. Made implicitly from a std::string,
// which it takes over (moving in costs no copy of the bytes), or explicitly
// from a buffer the caller already shares. Immutable; copying is O(1).
class MediaBytes {
 public:
  MediaBytes() = default;
  MediaBytes(std::string bytes)  // NOLINT(google-explicit-constructor): {jpeg} reads as bytes
      : bytes_(std::make_shared<const std::string>(std::move(bytes))) {}
  MediaBytes(const char* bytes) : MediaBytes(std::string(bytes)) {}  // NOLINT(google-explicit-constructor)
  explicit MediaBytes(std::shared_ptr<const std::string> bytes) : bytes_(std::move(bytes)) {}

  std::string_view view() const { return bytes_ == nullptr ? std::string_view() : std::string_view(*bytes_); }
  std::span<const std::uint8_t> span() const {
    const std::string_view v = view();
    return {reinterpret_cast<const std::uint8_t*>(v.data()), v.size()};
  }
  std::size_t size() const { return view().size(); }
  bool empty() const { return size() == 0; }

 private:
  std::shared_ptr<const std::string> bytes_;
};

// The key namespace a request's items are cached under (tenant isolation,
// docs/SECURITY.md). Set by the server from the caller's credential; the
// worker applies it in one place (KeysFor), so the caches, the in-flight
// joins, L3 values and leases, shared-memory spans and CUDA IPC exports see
// only namespaced keys (epd/media/tenant_key.h). Unset (EncodeRequest::
// key_namespace empty) = no isolation: every caller shares one key space.
struct KeyNamespace {
  // The HMAC secret (--tenant-secret-file's bytes); non-null, shared.
  std::shared_ptr<const std::string> secret;
  // The namespace of the request's own items: "tenant:<name>".
  std::string name;
  // Items marked is_public go to the "public" namespace instead (the tenant
  // is one of --public-readers).
  bool public_allowed = false;
};

// The namespace name of public items (KeyNamespace::public_allowed).
inline constexpr std::string_view kPublicNamespace = "public";

// A video item's input: the container bytes (MP4/H.264, WebM/VP9, ...:
// what WorkerOptions::decode_video reads) or a list of encoded frame images
// (SampleFrameList), exactly one of the two; and optional sampling options
// (default WorkerOptions::video_sampling).
struct VideoInput {
  MediaBytes container;
  std::vector<MediaBytes> frames;
  std::optional<VideoSampling> sampling;
};

// One image or video of a request.
struct EncodeItemInput {
  // Encoded bytes (JPEG, PNG, WebP, GIF or BMP) as received.
  MediaBytes media;
  // Optional caller-supplied content identity (e.g. a gateway's hash): the key
  // becomes CallerContentKey(model_id, preprocess, caller_key) and the bytes
  // are not hashed. The caller vouches that equal keys mean equal media. An
  // empty string fails the item with kInvalidArgument.
  std::optional<std::string> caller_key;
  // Post-merge tokens the caller's prompt reserves for the image; 0 = unknown
  // (the header's count is used to check hits). Negative, or different from
  // what the image header gives, fails the item (kInvalidArgument).
  std::int64_t expected_tokens = 0;
  // Set for a video item (then `media` and `caller_key` must be empty): it is
  // decoded and sampled, cut into temporal chunks and answered from them
  // (docs/VIDEO.md). expected_tokens, when > 0, must equal the video's
  // post-merge tokens.
  std::optional<VideoInput> video;
  // The caller marks the item shareable across tenants (catalog images,
  // shared system images). It changes the key only when the request's
  // KeyNamespace allows public items (see KeyNamespace); otherwise it is
  // ignored and the item stays in its tenant's namespace.
  bool is_public = false;

  bool is_video() const { return video.has_value(); }
};

struct EncodeRequest {
  std::string id;  // unique among in-flight requests; non-empty
  std::vector<EncodeItemInput> items;
  // Whose request this is: ScheduleOrder::kFair shares the tower fairly
  // across tenants, and every order shares the video decode threads (one
  // tenant's decodes never hold all of them). Requests with the same tenant
  // share one fair share; "" is a tenant like any other.
  std::string tenant{};
  // See KeyNamespace; nullopt = unsalted keys.
  std::optional<KeyNamespace> key_namespace{};
};

}  // namespace epd
