// libFuzzer entry point for the HTTP edge (epd/http/http_endpoint.h): the
// bytes a client sends, through a real HttpEndpoint on loopback, started
// once. Beyond "no crash, no sanitizer report" it checks, and aborts if one
// breaks:
//   - every answer is a well-formed HTTP/1.1 response (or none: the client
//     sent no complete head), with a status the endpoint or a route sends;
//   - every error page is valid UTF-8, whatever bytes the request held;
//   - the endpoint still answers a plain request afterwards;
//   - Utf8Safe on the input is valid UTF-8, and a fixed point.
// The same function is linked into http_request_corpus_replay (any compiler).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>

#include "epd/http/http_endpoint.h"

namespace {

[[noreturn]] void Violated(const char* what, const std::string& detail) {
  std::fprintf(stderr, "http_request_fuzzer: invariant violated: %s\n%s\n", what, detail.c_str());
  std::abort();
}

epd::HttpEndpoint& Endpoint() {
  static epd::HttpEndpoint* ep = [] {
    epd::HttpEndpointOptions o;
    o.max_body_bytes = 4096;
    o.max_header_bytes = 2048;
    o.header_timeout = std::chrono::milliseconds(500);
    o.body_timeout = std::chrono::milliseconds(500);
    o.authorize = [](const std::optional<std::string>& h) {
      return h == "Bearer t" ? epd::Status::Ok() : epd::Status(epd::StatusCode::kUnauthenticated, "bad token");
    };
    o.error_page = [](int status, const std::string& m) { return epd::HttpResponse{status, "text/plain", "E:" + m}; };
    auto started =
        epd::HttpEndpoint::Start(o, {{"GET", "/health", false,
                                      [](const epd::HttpRequest&) {
                                        return epd::HttpResponse{200, "text/plain", "ok"};
                                      }},
                                     {"POST", "/echo", true,
                                      [](const epd::HttpRequest& r) {
                                        return epd::HttpResponse{200, "text/plain", std::string(r.body)};
                                      }},
                                     {"GET", "/throw", false, [](const epd::HttpRequest& r) -> epd::HttpResponse {
                                        throw std::runtime_error("thrown for " + r.path);
                                      }}});
    if (!started.ok()) Violated("the endpoint did not start", started.status().ToString());
    return started->release();
  }();
  return *ep;
}

// Sends `bytes`, closes the sending side, and reads until the server closes.
std::string Exchange(const std::string& bytes) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(Endpoint().port()));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) Violated("connect failed", "");
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  shutdown(fd, SHUT_WR);
  std::string got;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) got.append(buf, static_cast<std::size_t>(n));
  close(fd);
  return got;
}

void CheckResponses(const std::string& got) {
  static const std::set<int> kStatuses = {100, 200, 400, 401, 404, 405, 408, 413, 414, 431, 500, 503};
  for (std::size_t at = 0; at < got.size();) {
    if (got.compare(at, 9, "HTTP/1.1 ") != 0) Violated("not an HTTP/1.1 response", got.substr(at, 200));
    const int status = std::atoi(got.c_str() + at + 9);
    if (kStatuses.count(status) == 0) Violated("an unexpected status", got.substr(at, 200));
    const std::size_t head_end = got.find("\r\n\r\n", at);
    if (head_end == std::string::npos) Violated("a response head without its end", got.substr(at, 200));
    if (status == 100) {
      at = head_end + 4;
      continue;
    }
    const std::size_t cl = got.find("Content-Length: ", at);
    if (cl == std::string::npos || cl > head_end) Violated("a response without Content-Length", got.substr(at, 200));
    const std::size_t length = std::strtoul(got.c_str() + cl + 16, nullptr, 10);
    const std::string body = got.substr(head_end + 4, length);
    if (status >= 400 && epd::Utf8Safe(body) != body) Violated("an error page that is not UTF-8", body);
    at = head_end + 4 + length;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  const std::string safe = epd::Utf8Safe(bytes);
  if (epd::Utf8Safe(safe) != safe) Violated("Utf8Safe is not a fixed point", safe);
  CheckResponses(Exchange(bytes));
  const std::string after = Exchange("GET /health HTTP/1.1\r\nHost: f\r\n\r\n");
  if (after.rfind("HTTP/1.1 200", 0) != 0) Violated("the endpoint stopped answering", after);
  return 0;
}
