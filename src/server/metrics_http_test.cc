// The /metrics endpoint against misbehaving HTTP clients: a connection that
// sends nothing, or trickles its request, or idles after a scrape, must not
// hold up anyone's scrape (issue 27, fault 6); and with a token the page
// needs it. The endpoint is driven through internal::ServerMetrics with a
// fixed ServerStats, so the page's values are known here.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "auth.h"
#include "metrics.h"

namespace epd::internal {
namespace {

using std::chrono::milliseconds;

int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  // A bound so a broken endpoint fails the test instead of hanging it.
  timeval tv{60, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

std::string Scrape(int port, const std::string& headers = "") {
  const int fd = Connect(port);
  const std::string req = "GET /metrics HTTP/1.0\r\n" + headers + "\r\n";
  EXPECT_EQ(send(fd, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) out.append(buf, static_cast<std::size_t>(n));
  close(fd);
  return out;
}

// True when the server has closed `fd` (EOF readable), without waiting.
bool ClosedByServer(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  char c;
  return recv(fd, &c, 1, MSG_DONTWAIT) == 0;
}

ServerStats Fixed() {
  ServerStats s;
  s.worker.misses = 7;
  return s;
}

MetricsEndpointOptions On(std::chrono::milliseconds read_timeout) {
  MetricsEndpointOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.read_timeout = read_timeout;
  return o;
}

TEST(MetricsHttpTest, SilentConnectionDoesNotBlockAScrape) {
  ServerMetrics m(Fixed);
  // A read timeout far longer than any scrape: the scrape below cannot be
  // waiting for the silent connection to time out.
  ASSERT_TRUE(m.Serve(On(std::chrono::minutes(10))).ok());
  const int silent = Connect(m.port());
  const std::string page = Scrape(m.port());
  EXPECT_NE(page.find(" 200 OK\r\n"), std::string::npos) << page;
  EXPECT_NE(page.find("epd_cache_misses_total 7\n"), std::string::npos) << page;
  // Still open: the scrape was answered beside it, not after it.
  EXPECT_FALSE(ClosedByServer(silent));
  close(silent);
  m.Stop();
}

TEST(MetricsHttpTest, ManySilentConnectionsDoNotBlockAScrape) {
  ServerMetrics m(Fixed);
  ASSERT_TRUE(m.Serve(On(std::chrono::minutes(10))).ok());
  std::vector<int> silent;
  silent.reserve(8);
  for (int i = 0; i < 8; ++i) silent.push_back(Connect(m.port()));
  EXPECT_NE(Scrape(m.port()).find("epd_cache_misses_total 7\n"), std::string::npos);
  for (int fd : silent) close(fd);
  m.Stop();
}

// Fault 6: 16 idle connections made every scrape of the old responder take
// 4.5 s and 200 made it time out, since each held one of its 16 threads
// for the read timeout. Here 200 connections that sent nothing, and 40
// that scraped once over keep-alive and then went quiet, all stay open
// (a 10-minute read timeout) while a fresh scrape is answered.
TEST(MetricsHttpTest, TwoHundredIdleConnectionsDoNotBlockAScrape) {
  ServerMetrics m(Fixed);
  ASSERT_TRUE(m.Serve(On(std::chrono::minutes(10))).ok());
  std::vector<int> idle;
  idle.reserve(240);
  for (int i = 0; i < 200; ++i) idle.push_back(Connect(m.port()));
  for (int i = 0; i < 40; ++i) {
    const int fd = Connect(m.port());
    const std::string req = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
    ASSERT_EQ(send(fd, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
    std::string got;
    char buf[4096];
    while (got.find("epd_cache_misses_total 7\n") == std::string::npos) {
      const ssize_t n = read(fd, buf, sizeof(buf));
      ASSERT_GT(n, 0) << got;
      got.append(buf, static_cast<std::size_t>(n));
    }
    idle.push_back(fd);  // kept alive, now idle
  }
  for (int k = 0; k < 3; ++k) EXPECT_NE(Scrape(m.port()).find("epd_cache_misses_total 7\n"), std::string::npos);
  for (int fd : idle) {
    EXPECT_FALSE(ClosedByServer(fd));
    close(fd);
  }
  m.Stop();
}

// With the server's bearer token, a scrape must carry it (Prometheus sends
// `authorization` from its scrape config).
TEST(MetricsHttpTest, AScrapeNeedsTheBearerTokenWhenAuthIsOn) {
  ServerMetrics m(Fixed);
  auto token = std::make_shared<TokenCheck>("s3cret");
  MetricsEndpointOptions o = On(std::chrono::seconds(5));
  o.authorize = [token](const std::optional<std::string>& h) { return token->CheckHeader(h); };
  ASSERT_TRUE(m.Serve(o).ok());
  const std::string none = Scrape(m.port());
  EXPECT_NE(none.find(" 401 Unauthorized\r\n"), std::string::npos) << none;
  EXPECT_EQ(none.find("epd_cache_misses_total"), std::string::npos) << none;
  EXPECT_NE(none.find("WWW-Authenticate: Bearer"), std::string::npos) << none;
  const std::string wrong = Scrape(m.port(), "Authorization: Bearer nope\r\n");
  EXPECT_NE(wrong.find(" 401 Unauthorized\r\n"), std::string::npos) << wrong;
  EXPECT_NE(wrong.find("the bearer token is not this server's"), std::string::npos) << wrong;
  const std::string right = Scrape(m.port(), "Authorization: Bearer s3cret\r\n");
  EXPECT_NE(right.find(" 200 OK\r\n"), std::string::npos) << right;
  EXPECT_NE(right.find("epd_cache_misses_total 7\n"), std::string::npos) << right;
  m.Stop();
}

TEST(MetricsHttpTest, TricklingClientIsClosedAfterTheReadTimeout) {
  ServerMetrics m(Fixed);
  ASSERT_TRUE(m.Serve(On(milliseconds(200))).ok());
  const int slow = Connect(m.port());
  // One byte of a never-ending header line every 20 ms: each read succeeds,
  // so only a deadline on the whole head ends it. Give up after 3000 bytes
  // (60 s), still under the 8 KiB head limit.
  bool closed = false;
  for (int i = 0; i < 3000 && !closed; ++i) {
    if (send(slow, "x", 1, MSG_NOSIGNAL) != 1) {
      closed = true;
      break;
    }
    std::this_thread::sleep_for(milliseconds(20));
    closed = ClosedByServer(slow);
  }
  EXPECT_TRUE(closed);
  close(slow);
  // And the endpoint still answers.
  EXPECT_NE(Scrape(m.port()).find("epd_cache_misses_total 7\n"), std::string::npos);
  m.Stop();
}

TEST(MetricsHttpTest, StopReturnsWhileAConnectionIsSilent) {
  ServerMetrics m(Fixed);
  ASSERT_TRUE(m.Serve(On(std::chrono::minutes(10))).ok());
  const int silent = Connect(m.port());
  // Let the accept thread take it, so Stop has a connection thread to end.
  EXPECT_NE(Scrape(m.port()).find("200 OK"), std::string::npos);
  m.Stop();  // must not wait out the 10-minute read timeout
  char c;
  EXPECT_EQ(recv(silent, &c, 1, 0), 0);  // closed unanswered
  close(silent);
}

}  // namespace
}  // namespace epd::internal
