// See connection.h.
#include "connection.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>

namespace epd::internal {
namespace {

// Compacts the buffer once most of it has been consumed.
void Compact(std::string& in, std::size_t& off) {
  if (off > 0 && off * 2 >= in.size()) {
    in.erase(0, off);
    off = 0;
  }
}

void Address(int fd, bool peer, std::string& ip, int& port) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  const int rc = peer ? getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len)
                      : getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  ip.clear();
  port = 0;
  if (rc != 0) return;
  char buf[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, buf, sizeof(buf));
    port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof(buf));
    port = ntohs(a->sin6_port);
  }
  ip = buf;
}

}  // namespace

Connection::~Connection() {
  if (ssl != nullptr) {
    if (handshaken) SSL_shutdown(ssl);  // best effort close_notify
    SSL_free(ssl);
  }
  close(fd);
}

bool Connection::HeadComplete() const {
  const std::string_view p = pending();
  return p.find("\r\n\r\n") != std::string_view::npos || p.find("\n\n") != std::string_view::npos;
}

std::optional<std::uint64_t> Connection::DeclaredContentLength() const {
  const std::string_view p = pending();
  const std::size_t end = std::min(p.find("\r\n\r\n"), p.find("\n\n"));
  if (end == std::string_view::npos) return std::nullopt;
  std::string head(p.substr(0, end));
  std::transform(head.begin(), head.end(), head.begin(), [](unsigned char c) { return std::tolower(c); });
  const std::size_t at = head.find("\ncontent-length:");
  if (at == std::string::npos) return std::nullopt;
  std::size_t i = at + 16;
  while (i < head.size() && (head[i] == ' ' || head[i] == '\t')) ++i;
  std::uint64_t n = 0;
  bool digits = false;
  for (; i < head.size() && head[i] >= '0' && head[i] <= '9'; ++i) {
    if (n > (UINT64_MAX - 9) / 10) return std::nullopt;
    n = n * 10 + static_cast<std::uint64_t>(head[i] - '0');
    digits = true;
  }
  return digits ? std::optional<std::uint64_t>(n) : std::nullopt;
}

Connection::Io Connection::Handshake() {
  if (ssl == nullptr || handshaken) return Io::kProgress;
  const int rc = SSL_accept(ssl);
  if (rc == 1) {
    handshaken = true;
    return Io::kProgress;
  }
  const int err = SSL_get_error(ssl, rc);
  if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) return Io::kWouldBlock;
  ERR_clear_error();
  return Io::kClosed;
}

long Connection::RecvSome(char* p, std::size_t n, bool& would_block) {
  would_block = false;
  if (ssl == nullptr) {
    const ssize_t got = recv(fd, p, n, MSG_DONTWAIT);
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) would_block = true;
    return static_cast<long>(got);
  }
  const int got = SSL_read(ssl, p, static_cast<int>(std::min<std::size_t>(n, 1 << 30)));
  if (got > 0) return got;
  const int err = SSL_get_error(ssl, got);
  if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
    would_block = true;
    return -1;
  }
  ERR_clear_error();
  return err == SSL_ERROR_ZERO_RETURN ? 0 : -1;
}

long Connection::SendSome(const char* p, std::size_t n, bool& would_block) {
  would_block = false;
  if (ssl == nullptr) {
    const ssize_t put = send(fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (put < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) would_block = true;
    return static_cast<long>(put);
  }
  const int put = SSL_write(ssl, p, static_cast<int>(std::min<std::size_t>(n, 1 << 30)));
  if (put > 0) return put;
  const int err = SSL_get_error(ssl, put);
  if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
    would_block = true;
  } else {
    ERR_clear_error();
  }
  return -1;
}

Connection::Io Connection::ReadAvailable(std::size_t limit) {
  Compact(in, in_off);
  bool any = false;
  char buf[16384];
  while (pending().size() < limit) {
    bool would_block = false;
    const long got = RecvSome(buf, std::min(sizeof(buf), limit - pending().size()), would_block);
    if (got > 0) {
      in.append(buf, static_cast<std::size_t>(got));
      any = true;
      continue;
    }
    if (would_block) break;
    return Io::kClosed;  // EOF or an error
  }
  return any ? Io::kProgress : Io::kWouldBlock;
}

void Connection::SendNow(std::string_view bytes) {
  bool would_block = false;
  while (!bytes.empty()) {
    const long put = SendSome(bytes.data(), bytes.size(), would_block);
    if (put <= 0) return;
    bytes.remove_prefix(static_cast<std::size_t>(put));
  }
}

bool ConnStream::WaitFor(short events, HttpClock::time_point until) const {
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - HttpClock::now()).count();
    if (left <= 0) return false;
    pollfd p{c_.fd, events, 0};
    const int rc = poll(&p, 1, static_cast<int>(std::min<long long>(left, 1 << 30)));
    if (rc > 0) return true;
    if (rc < 0 && errno != EINTR) return false;
  }
}

bool ConnStream::is_readable() const {
  if (!c_.pending().empty()) return true;
  if (c_.ssl != nullptr && SSL_pending(c_.ssl) > 0) return true;
  return WaitFor(POLLIN, read_deadline_);
}

bool ConnStream::is_writable() const { return WaitFor(POLLOUT, HttpClock::now() + write_timeout_); }

ssize_t ConnStream::read(char* ptr, size_t size) {
  if (const std::string_view p = c_.pending(); !p.empty()) {
    const std::size_t n = std::min(size, p.size());
    std::copy_n(p.data(), n, ptr);
    c_.in_off += n;
    Compact(c_.in, c_.in_off);
    return static_cast<ssize_t>(n);
  }
  for (;;) {
    bool would_block = false;
    const long got = c_.RecvSome(ptr, size, would_block);
    if (!would_block) return got;
    // (Renegotiation, the one case where a TLS read must write, is off:
    // tls_context.cc.)
    if (!WaitFor(POLLIN, read_deadline_)) {
      timed_out_ = true;
      return -1;
    }
  }
}

ssize_t ConnStream::write(const char* ptr, size_t size) {
  for (;;) {
    bool would_block = false;
    const long put = c_.SendSome(ptr, size, would_block);
    if (!would_block) return put;
    if (!WaitFor(POLLOUT, HttpClock::now() + write_timeout_)) return -1;
  }
}

void ConnStream::get_remote_ip_and_port(std::string& ip, int& port) const { Address(c_.fd, true, ip, port); }
void ConnStream::get_local_ip_and_port(std::string& ip, int& port) const { Address(c_.fd, false, ip, port); }

}  // namespace epd::internal
