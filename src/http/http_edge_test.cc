// HttpEndpoint against hostile clients on loopback (issue 40): bytes that
// are not UTF-8, bodies past the limit in every framing, the token checked
// before the body, slow bodies, handlers that throw or never answer, clients
// that leave, and every status counted. Expected values are written out.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "epd/http/http_endpoint.h"
#include "http_test_util.h"

namespace epd {
namespace {

using std::chrono::milliseconds;
using namespace epd::testing_http;

std::vector<HttpRoute> Routes(std::atomic<bool>* gone_seen = nullptr) {
  return {{"GET", "/health", false,
           [](const HttpRequest&) {
             return HttpResponse{200, "text/plain", "ok\n"};
           }},
          {"POST", "/echo", true,
           [](const HttpRequest& r) {
             return HttpResponse{200, "text/plain", std::to_string(r.body.size())};
           }},
          {"GET", "/throw", false, [](const HttpRequest&) -> HttpResponse { throw std::runtime_error("bad \xff"); }},
          {"GET", "/silent", false, nullptr, [](const HttpRequest&, const HttpResponder&) {}},
          {"GET", "/wait", false, nullptr, [gone_seen](const HttpRequest&, const HttpResponder& respond) {
             std::thread([respond, gone_seen] {
               for (int i = 0; i < 500 && !respond.client_gone(); ++i) std::this_thread::sleep_for(milliseconds(10));
               if (gone_seen != nullptr) *gone_seen = respond.client_gone();
               respond(HttpResponse{200, "text/plain", "late"});
             }).detach();
           }}};
}

HttpEndpointOptions Options() {
  HttpEndpointOptions o;
  o.error_page = [](int status, const std::string& m) { return HttpResponse{status, "text/plain", "[" + m + "]"}; };
  o.authorize = [](const std::optional<std::string>& h) {
    return h == "Bearer t" ? Status::Ok() : Status(StatusCode::kUnauthenticated, "no token");
  };
  return o;
}

std::unique_ptr<HttpEndpoint> StartOrDie(HttpEndpointOptions o, std::vector<HttpRoute> routes = Routes()) {
  auto ep = HttpEndpoint::Start(std::move(o), std::move(routes));
  EXPECT_TRUE(ep.ok()) << ep.status().ToString();
  return ep.ok() ? std::move(*ep) : nullptr;
}

int Code(const std::string& response) { return response.size() > 12 ? std::stoi(response.substr(9, 3)) : 0; }

TEST(Utf8SafeTest, KeepsValidTextAndEscapesEveryOtherByte) {
  EXPECT_EQ(Utf8Safe("plain/path"), "plain/path");
  EXPECT_EQ(Utf8Safe("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"), "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
  EXPECT_EQ(Utf8Safe("/\xff\xfe"), "/\\xFF\\xFE");
  EXPECT_EQ(Utf8Safe("cut\xc3"), "cut\\xC3");                       // a sequence cut short
  EXPECT_EQ(Utf8Safe("\xc0\xaf"), "\\xC0\\xAF");                    // overlong '/'
  EXPECT_EQ(Utf8Safe("\xed\xa0\x80"), "\\xED\\xA0\\x80");           // a surrogate
  EXPECT_EQ(Utf8Safe("\xf4\x90\x80\x80"), "\\xF4\\x90\\x80\\x80");  // past U+10FFFF
}

TEST(HttpEdgeTest, PathsThatAreNotUtf8GetAPageThatIs) {
  auto ep = StartOrDie(Options());
  const std::string raw = Exchange(ep->port(), "GET /\xff\xfe HTTP/1.1\r\nHost: t\r\n\r\n");
  EXPECT_EQ(Code(raw), 404) << raw;
  EXPECT_NE(raw.find("[no route for GET /\\xFF\\xFE]"), std::string::npos) << raw;
  const std::string pct = Exchange(ep->port(), "GET /%ff HTTP/1.1\r\nHost: t\r\n\r\n");
  EXPECT_NE(pct.find("[no route for GET /%ff]"), std::string::npos) << pct;
  EXPECT_EQ(Code(Exchange(ep->port(), "GET /health HTTP/1.1\r\nHost: t\r\n\r\n")), 200);
}

TEST(HttpEdgeTest, AThrowingHandlerIsACounted500AndAnUnansweredOneToo) {
  auto ep = StartOrDie(Options());
  const std::string thrown = Exchange(ep->port(), "GET /throw HTTP/1.1\r\nHost: t\r\n\r\n");
  EXPECT_EQ(Code(thrown), 500) << thrown;
  EXPECT_NE(thrown.find("[internal error: bad \\xFF]"), std::string::npos) << thrown;
  const std::string silent = Exchange(ep->port(), "GET /silent HTTP/1.1\r\nHost: t\r\n\r\n");
  EXPECT_EQ(Code(silent), 500) << silent;
  EXPECT_NE(silent.find("the handler did not answer"), std::string::npos) << silent;
  EXPECT_EQ(ep->Stats().handler_exceptions, 2u);
  EXPECT_EQ(ep->Stats().responses.at(500), 2u);
}

TEST(HttpEdgeTest, TheTokenIsCheckedFromTheHeadBeforeAnyBodyByte) {
  auto ep = StartOrDie(Options());
  for (const char* framing : {"Content-Length: 600000000\r\n", "Transfer-Encoding: chunked\r\n"}) {
    const int fd = Connect(ep->port());
    ASSERT_TRUE(SendAll(fd, std::string("POST /echo HTTP/1.1\r\nHost: t\r\n") + framing + "\r\n"));
    const std::string r = ReadResponse(fd);  // no body byte was sent
    EXPECT_EQ(Code(r), 401) << r;
    EXPECT_NE(r.find("WWW-Authenticate: Bearer"), std::string::npos) << r;
    close(fd);
  }
  EXPECT_EQ(ep->Stats().responses.at(401), 2u);
}

TEST(HttpEdgeTest, AChunkedBodyIsBoundAsItArrives) {
  HttpEndpointOptions o = Options();
  o.max_body_bytes = 1000;
  auto ep = StartOrDie(o);
  const int fd = Connect(ep->port());
  ASSERT_TRUE(SendAll(fd,
                      "POST /echo HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer t\r\n"
                      "Transfer-Encoding: chunked\r\n\r\n"));
  const std::string chunk = "190\r\n" + std::string(400, 'x') + "\r\n";  // 400 bytes a chunk
  for (int i = 0; i < 3; ++i) SendAll(fd, chunk);
  const std::string r = ReadResponse(fd);
  EXPECT_EQ(Code(r), 413) << r;
  EXPECT_NE(r.find("[the request body is over 1000 bytes]"), std::string::npos) << r;
  close(fd);
  const std::string ok = Exchange(ep->port(),
                                  "POST /echo HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer t\r\nTransfer-Encoding: "
                                  "chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n");
  EXPECT_EQ(ok.substr(ok.size() - 1), "5") << ok;
  EXPECT_EQ(ep->Stats().bodies_too_large, 1u);
}

// Ten chunked bodies trickle; each is charged for what arrived, not for the
// limit, so a body of known length still finds room in the budget (4 x the
// limit) and is answered.
TEST(HttpEdgeTest, SlowChunkedBodiesDoNotFillTheBodyBudget) {
  HttpEndpointOptions o = Options();
  o.max_body_bytes = 10000;
  auto ep = StartOrDie(o);
  std::vector<int> slow;
  for (int i = 0; i < 10; ++i) {
    slow.push_back(Connect(ep->port()));
    SendAll(slow.back(),
            "POST /echo HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer t\r\n"
            "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n");
  }
  const std::string body(5000, 'y');
  const std::string ok = Exchange(ep->port(),
                                  "POST /echo HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer t\r\n"
                                  "Content-Length: 5000\r\n\r\n" +
                                      body);
  EXPECT_EQ(Code(ok), 200) << ok;
  EXPECT_EQ(ok.substr(ok.size() - 4), "5000") << ok;
  for (int fd : slow) close(fd);
}

// Six bodies announce the limit and trickle: each holds what it sent, not
// what it announced, so another body still finds room (old code: four of
// them reserved the whole budget and the next body waited for room until
// its body_timeout, then got 503).
TEST(HttpEdgeTest, SlowAnnouncedBodiesHoldWhatTheySentNotTheirLength) {
  HttpEndpointOptions o = Options();
  o.max_body_bytes = 1 << 20;
  o.min_body_bytes_per_s = 1;  // the slow bodies are never cut while the test runs
  auto ep = StartOrDie(o);
  std::vector<int> slow;
  for (int i = 0; i < 6; ++i) {
    slow.push_back(Connect(ep->port()));
    SendAll(slow.back(),
            "POST /echo HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer t\r\n"
            "Content-Length: 1048576\r\n\r\nabc");
  }
  const std::string ok = Exchange(ep->port(),
                                  "POST /echo HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer t\r\n"
                                  "Content-Length: 5000\r\n\r\n" +
                                      std::string(5000, 'z'));
  EXPECT_EQ(Code(ok), 200) << ok;
  EXPECT_EQ(ok.substr(ok.size() - 4), "5000") << ok;
  EXPECT_EQ(ep->Stats().body_timeouts, 0u);  // answered before any slow body was cut
  for (int fd : slow) close(fd);
}

TEST(HttpEdgeTest, SlowBodiesHoldNoThreadAndMeetTheMinimumRate) {
  HttpEndpointOptions o = Options();
  o.threads = 1;
  o.min_body_bytes_per_s = 1000;
  auto ep = StartOrDie(o);
  std::vector<int> slow;
  for (int i = 0; i < 20; ++i) {
    slow.push_back(Connect(ep->port()));
    SendAll(slow.back(), "POST /echo HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer t\r\nContent-Length: 5000\r\n\r\nab");
  }
  // Twenty bodies trickle; the one thread still serves a whole request.
  const std::string ok =
      Exchange(ep->port(), "POST /echo HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer t\r\nContent-Length: 3\r\n\r\nabc");
  EXPECT_EQ(ok.substr(ok.size() - 1), "3") << ok;
  for (int fd : slow) {
    const std::string r = ReadResponse(fd);  // 2 bytes in over a second: too slow
    EXPECT_EQ(Code(r), 408) << r;
    EXPECT_NE(r.find("arrives too slowly"), std::string::npos) << r;
    close(fd);
  }
  EXPECT_EQ(ep->Stats().body_timeouts, 20u);
}

TEST(HttpEdgeTest, HeadAndTargetLimitsAnswer431And414) {
  HttpEndpointOptions o = Options();
  o.max_header_bytes = 2000;
  auto ep = StartOrDie(o);
  const std::string big_head =
      Exchange(ep->port(), "GET /health HTTP/1.1\r\nHost: t\r\nX-Big: " + std::string(3000, 'a') + "\r\n\r\n");
  EXPECT_EQ(Code(big_head), 431) << big_head;
  o.max_header_bytes = 16 << 10;
  auto ep2 = StartOrDie(o);
  const std::string long_target =
      Exchange(ep2->port(), "GET /" + std::string(9000, 'a') + " HTTP/1.1\r\nHost: t\r\n\r\n");
  EXPECT_EQ(Code(long_target), 414) << long_target;
  EXPECT_EQ(ep2->Stats().responses.at(414), 1u);
}

TEST(HttpEdgeTest, ExpectContinueIsAnsweredBeforeTheBody) {
  auto ep = StartOrDie(Options());
  const int fd = Connect(ep->port());
  ASSERT_TRUE(SendAll(fd,
                      "POST /echo HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer t\r\nExpect: 100-continue\r\n"
                      "Content-Length: 4\r\n\r\n"));
  char buf[64] = {};
  const ssize_t n = read(fd, buf, sizeof(buf) - 1);
  ASSERT_GT(n, 0);
  EXPECT_EQ(std::string(buf, static_cast<std::size_t>(n)), "HTTP/1.1 100 Continue\r\n\r\n");
  SendAll(fd, "abcd");
  const std::string r = ReadResponse(fd);
  EXPECT_EQ(r.substr(r.size() - 1), "4") << r;
  close(fd);
}

TEST(HttpEdgeTest, AClientThatLeavesIsSeenByItsHandler) {
  std::atomic<bool> gone{false};
  auto ep = StartOrDie(Options(), Routes(&gone));
  const int fd = Connect(ep->port());
  ASSERT_TRUE(SendAll(fd, "GET /wait HTTP/1.1\r\nHost: t\r\n\r\n"));
  std::this_thread::sleep_for(milliseconds(100));
  close(fd);
  for (int i = 0; i < 500 && ep->Stats().clients_gone == 0; ++i) std::this_thread::sleep_for(milliseconds(10));
  EXPECT_EQ(ep->Stats().clients_gone, 1u);
  for (int i = 0; i < 500 && !gone; ++i) std::this_thread::sleep_for(milliseconds(10));
  EXPECT_TRUE(gone);
}

// A pipelined request leaves no read pending while the one before it is
// served; once the body's rate timer (1 s after the body began) had fired,
// nothing held the connection and the answer was dropped with it: the
// client saw a close, no response.
TEST(HttpEdgeTest, APipelinedRequestWaitsForASlowAnswerBeforeIt) {
  auto release = std::make_shared<std::atomic<bool>>(false);
  std::vector<HttpRoute> routes = Routes();
  routes.push_back({"POST", "/gate", false, nullptr, [release](const HttpRequest&, const HttpResponder& respond) {
                      std::thread([release, respond] {
                        for (int i = 0; i < 3000 && !*release; ++i) std::this_thread::sleep_for(milliseconds(10));
                        respond(HttpResponse{200, "text/plain", "gate"});
                      }).detach();
                    }});
  auto ep = StartOrDie(Options(), routes);
  const int fd = Connect(ep->port());
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendAll(fd,
                      "POST /gate HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\nhi"
                      "GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"));
  std::this_thread::sleep_for(milliseconds(1500));  // past the timer that held the connection
  *release = true;
  // Both answers, read to the close the second asks for (one read may hold
  // both, so they are not read one ReadResponse each).
  std::string both;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) both.append(buf, static_cast<std::size_t>(n));
  close(fd);
  EXPECT_EQ(Code(both), 200) << both;
  const std::size_t second = both.find("HTTP/1.1 ", 1);
  ASSERT_NE(second, std::string::npos) << both;
  EXPECT_NE(both.substr(0, second).find("gate"), std::string::npos) << both;
  EXPECT_EQ(Code(both.substr(second)), 200) << both;
}

// A transfer coding that is not chunked: Beast read the body as empty and
// served its bytes as a second request; RFC 9112 6.3 wants a 400 and a close.
TEST(HttpEdgeTest, ATransferEncodingOtherThanChunkedIsRefusedNotSmuggled) {
  auto ep = StartOrDie(Options());
  for (const char* coding : {"identity", "xchunked", "chunked, gzip"}) {
    const std::string raw =
        Exchange(ep->port(), std::string("POST /echo HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer t\r\n") +
                                 "Transfer-Encoding: " + coding + "\r\n\r\nGET /health HTTP/1.1\r\nHost: t\r\n\r\n");
    EXPECT_EQ(Code(raw), 400) << coding << ": " << raw;
    EXPECT_EQ(raw.find("ok\n"), std::string::npos) << coding << ": the smuggled GET was served: " << raw;
  }
  EXPECT_EQ(ep->Stats().responses.count(200), 0u);
}

}  // namespace
}  // namespace epd
