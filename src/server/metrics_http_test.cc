// The /metrics endpoint against misbehaving HTTP clients: a connection that
// sends nothing, or trickles its request, must not hold up anyone's scrape.
// The endpoint is driven through internal::ServerMetrics with a fixed
// ServerStats, so the page's values are known here.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

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

std::string Scrape(int port) {
  const int fd = Connect(port);
  const std::string req = "GET /metrics HTTP/1.0\r\n\r\n";
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

TEST(MetricsHttpTest, SilentConnectionDoesNotBlockAScrape) {
  ServerMetrics m(Fixed);
  // A read timeout far longer than any scrape: the scrape below cannot be
  // waiting for the silent connection to time out.
  ASSERT_TRUE(m.Serve("127.0.0.1", 0, std::chrono::minutes(10)).ok());
  const int silent = Connect(m.port());
  const std::string page = Scrape(m.port());
  EXPECT_NE(page.find("HTTP/1.0 200 OK"), std::string::npos) << page;
  EXPECT_NE(page.find("epd_cache_misses_total 7\n"), std::string::npos) << page;
  // Still open: the scrape was answered beside it, not after it.
  EXPECT_FALSE(ClosedByServer(silent));
  close(silent);
  m.Stop();
}

TEST(MetricsHttpTest, ManySilentConnectionsDoNotBlockAScrape) {
  ServerMetrics m(Fixed);
  ASSERT_TRUE(m.Serve("127.0.0.1", 0, std::chrono::minutes(10)).ok());
  std::vector<int> silent;
  for (int i = 0; i < 8; ++i) silent.push_back(Connect(m.port()));
  EXPECT_NE(Scrape(m.port()).find("epd_cache_misses_total 7\n"), std::string::npos);
  for (int fd : silent) close(fd);
  m.Stop();
}

TEST(MetricsHttpTest, TricklingClientIsClosedAfterTheReadTimeout) {
  ServerMetrics m(Fixed);
  ASSERT_TRUE(m.Serve("127.0.0.1", 0, milliseconds(200)).ok());
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
  ASSERT_TRUE(m.Serve("127.0.0.1", 0, std::chrono::minutes(10)).ok());
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
