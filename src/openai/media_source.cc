// See media_source.h.
#include "media_source.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace epd::internal {
namespace {

std::string RealPath(const std::string& path) {
  char buf[PATH_MAX];
  return realpath(path.c_str(), buf) != nullptr ? std::string(buf) : std::string();
}

}  // namespace

StatusOr<std::unique_ptr<MediaSource>> MediaSource::Create(MediaFetchOptions fetch,
                                                           const std::string& allowed_local_path) {
  auto m = std::unique_ptr<MediaSource>(new MediaSource());
  m->max_bytes_ = fetch.max_bytes;
  StatusOr<std::unique_ptr<MediaFetcher>> f = MediaFetcher::Create(std::move(fetch));
  if (!f.ok()) return f.status();
  m->fetcher_ = std::move(*f);
  if (!allowed_local_path.empty()) {
    struct stat st {};
    m->local_root_ = RealPath(allowed_local_path);
    if (m->local_root_.empty() || stat(m->local_root_.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return InvalidArgument("--allowed-local-media-path " + allowed_local_path + " is not a directory");
    }
  }
  return m;
}

StatusOr<std::string> MediaSource::Resolve(const std::string& url) const {
  if (url.rfind("data:", 0) == 0) return FromData(url);
  if (url.rfind("file:", 0) == 0) return FromFile(url);
  if (url.rfind("http://", 0) == 0 || url.rfind("https://", 0) == 0) return fetcher_->Fetch(url);
  return InvalidArgument("the media URL '" + url.substr(0, 64) + "' is neither data:, http(s):// nor file://");
}

StatusOr<std::string> MediaSource::FromData(const std::string& url) const {
  const std::size_t comma = url.find(',');
  if (comma == std::string::npos || url.substr(0, comma).find(";base64") == std::string::npos) {
    return InvalidArgument("a data: media URL must be data:<type>;base64,<payload>");
  }
  const std::size_t encoded = url.size() - comma - 1;
  if (static_cast<std::int64_t>(encoded / 4 * 3) > max_bytes_ + 2) {
    return ResourceExhausted("the data: URL holds about " + std::to_string(encoded / 4 * 3) + " bytes; at most " +
                             std::to_string(max_bytes_) + " are accepted (--media-max-mb)");
  }
  const std::string_view payload = std::string_view(url).substr(comma + 1);
  std::string out(encoded / 4 * 3 + 3, '\0');
  auto* dst = reinterpret_cast<unsigned char*>(out.data());
  const auto* src = reinterpret_cast<const unsigned char*>(payload.data());
  // (Not find_first_of: libstdc++ runs a memchr over the set per character.)
  const bool one_block = payload.size() % 4 == 0 && std::none_of(payload.begin(), payload.end(), [](char c) {
                           return c == ' ' || c == '\t' || c == '\r' || c == '\n';
                         });
  if (one_block) {
    // One block, no line breaks: EVP_DecodeBlock, several times faster than
    // the line-oriented EVP_DecodeUpdate. It writes the padding's zero
    // bytes too, which are cut off here.
    const int n = EVP_DecodeBlock(dst, src, static_cast<int>(payload.size()));
    if (n < 0) return InvalidArgument("the data: URL's payload is not valid base64");
    const std::size_t pad = payload.ends_with("==") ? 2 : payload.ends_with("=") ? 1 : 0;
    out.resize(static_cast<std::size_t>(n) - pad);
  } else {
    EVP_ENCODE_CTX* ctx = EVP_ENCODE_CTX_new();
    EVP_DecodeInit(ctx);
    int n = 0, tail = 0;
    const int rc = EVP_DecodeUpdate(ctx, dst, &n, src, static_cast<int>(payload.size()));
    const int fin = rc < 0 ? -1 : EVP_DecodeFinal(ctx, dst + n, &tail);
    EVP_ENCODE_CTX_free(ctx);
    if (rc < 0 || fin < 0) return InvalidArgument("the data: URL's payload is not valid base64");
    out.resize(static_cast<std::size_t>(n) + static_cast<std::size_t>(tail));
  }
  if (out.empty()) return InvalidArgument("the data: URL's payload is empty");
  return out;
}

StatusOr<std::string> MediaSource::FromFile(const std::string& url) const {
  if (local_root_.empty()) {
    return Status(StatusCode::kPermissionDenied,
                  "file:// media URLs are off; start the server with --allowed-local-media-path DIR");
  }
  CURLU* u = curl_url();
  char* path = nullptr;
  char* host = nullptr;
  const bool parsed = curl_url_set(u, CURLUPART_URL, url.c_str(), 0) == CURLUE_OK &&
                      curl_url_get(u, CURLUPART_PATH, &path, CURLU_URLDECODE) == CURLUE_OK;
  curl_url_get(u, CURLUPART_HOST, &host, 0);
  const std::string p = path != nullptr ? path : "", h = host != nullptr ? host : "";
  curl_free(path);
  curl_free(host);
  curl_url_cleanup(u);
  if (!parsed || (!h.empty() && h != "localhost") || p.empty() || p[0] != '/') {
    return InvalidArgument("the media URL '" + url + "' is not file:///absolute/path");
  }
  const std::string real = RealPath(p);
  if (real.empty()) return Status(StatusCode::kNotFound, "the media file " + p + " does not exist");
  if (real.rfind(local_root_ + "/", 0) != 0) {
    return Status(StatusCode::kPermissionDenied,
                  "the media file " + p + " is outside --allowed-local-media-path " + local_root_);
  }
  const int fd = open(real.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  struct stat st {};
  if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    if (fd >= 0) close(fd);
    return Status(StatusCode::kPermissionDenied, "the media file " + p + " is not a regular file");
  }
  if (st.st_size > max_bytes_) {
    close(fd);
    return ResourceExhausted("the media file " + p + " is " + std::to_string(st.st_size) + " bytes; at most " +
                             std::to_string(max_bytes_) + " are accepted (--media-max-mb)");
  }
  std::string out(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t off = 0;
  while (off < out.size()) {
    const ssize_t n = read(fd, out.data() + off, out.size() - off);
    if (n <= 0) break;
    off += static_cast<std::size_t>(n);
  }
  close(fd);
  out.resize(off);
  return out;
}

}  // namespace epd::internal
