// libFuzzer entry point for the media-URL parser of the OpenAI front
// (src/openai/media_source.h): data:, file:// and http(s):// URLs as a
// client writes them. http(s) hosts are limited to one name that is never
// resolved here (inputs that could name it are skipped), so nothing leaves
// the machine. Beyond "no crash, no sanitizer report" it checks, and aborts
// if one breaks:
//   - a success is a data: or file:// URL (case-insensitive scheme) whose
//     bytes fit the limit;
//   - every failure has one of the documented codes, and its message is
//     valid UTF-8 (it is echoed into JSON pages).
// The same function is linked into media_url_corpus_replay (any compiler).
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "epd/http/http_endpoint.h"
#include "media_source.h"

namespace {

[[noreturn]] void Violated(const char* what, const std::string& detail) {
  std::fprintf(stderr, "media_url_fuzzer: invariant violated: %s\n%s\n", what, detail.c_str());
  std::abort();
}

constexpr std::int64_t kMaxBytes = 1 << 16;

epd::internal::MediaSource& Source() {
  static epd::internal::MediaSource* source = [] {
    const std::filesystem::path dir = "/tmp/epd-media-url-fuzz";  // the seeds name it
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "a.png") << "not really a png";
    epd::MediaFetchOptions o;
    o.max_bytes = kMaxBytes;
    o.allowed_domains = {"never.invalid"};
    o.timeout = std::chrono::milliseconds(200);
    auto created = epd::internal::MediaSource::Create(o, dir.string(), 2);
    if (!created.ok()) Violated("the media source did not start", created.status().ToString());
    return created->release();
  }();
  return *source;
}

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string url(reinterpret_cast<const char*>(data), size);
  const std::string lower = Lower(url);
  if (lower.find("invalid") != std::string::npos || lower.find('%') != std::string::npos) return 0;
  const epd::StatusOr<std::string> got = Source().Resolve(url);
  if (got.ok()) {
    if (lower.rfind("data:", 0) != 0 && lower.rfind("file:", 0) != 0)
      Violated("a success that is not data: or file:", url);
    if (static_cast<std::int64_t>(got->size()) > kMaxBytes) Violated("bytes over the limit", url);
    return 0;
  }
  switch (got.status().code()) {
    case epd::StatusCode::kInvalidArgument:
    case epd::StatusCode::kPermissionDenied:
    case epd::StatusCode::kNotFound:
    case epd::StatusCode::kResourceExhausted:
    case epd::StatusCode::kUnavailable:
    case epd::StatusCode::kDeadlineExceeded:
      break;
    default:
      Violated("an undocumented code", got.status().ToString());
  }
  const std::string m = got.status().message();
  if (epd::Utf8Safe(m) != m) Violated("a message that is not UTF-8", m);
  return 0;
}
