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
//                                 directory's own realpath and be a regular
//                                 file; otherwise kPermissionDenied (outside,
//                                 or no allowed path) or kNotFound
//   anything else                 kInvalidArgument
// Every source is bounded by max_bytes (kResourceExhausted past it: for a
// data URL, before decoding).
//
// Thread safety: Resolve is thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "epd/core/status.h"
#include "epd/http/media_fetch.h"

namespace epd::internal {

class MediaSource {
 public:
  // kInvalidArgument when allowed_local_path is set but not a directory.
  static StatusOr<std::unique_ptr<MediaSource>> Create(MediaFetchOptions fetch, const std::string& allowed_local_path);

  StatusOr<std::string> Resolve(const std::string& url) const;

 private:
  MediaSource() = default;
  StatusOr<std::string> FromData(const std::string& url) const;
  StatusOr<std::string> FromFile(const std::string& url) const;

  std::unique_ptr<MediaFetcher> fetcher_;
  std::int64_t max_bytes_ = 0;
  std::string local_root_;  // realpath, "" = file:// off
};

}  // namespace epd::internal
