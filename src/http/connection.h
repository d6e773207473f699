// src/http/connection.h (internal): one accepted HTTP connection, plain or
// TLS, and the httplib::Stream a pool thread reads one request through.
//
// A Connection owns its socket (non-blocking from admission on) and, for
// TLS, its OpenSSL session. Bytes read but not yet consumed by httplib stay
// in `in`, so a request head read by the park (connection_park.h), and any
// pipelined bytes after a response, are handed to the next request intact.
//
// Thread safety: a Connection belongs to one thread at a time (the park's,
// or the pool thread serving it); nothing in it is shared.
#pragma once

#include <httplib.h>
#include <openssl/ssl.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace epd::internal {

using HttpClock = std::chrono::steady_clock;

struct Connection {
  enum class Io { kProgress, kWouldBlock, kClosed };

  Connection(int fd, SSL* ssl) : fd(fd), ssl(ssl) {}
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Bytes received and not consumed yet.
  std::string_view pending() const { return std::string_view(in).substr(in_off); }
  // A complete request head ("\r\n\r\n", or "\n\n") is among pending().
  bool HeadComplete() const;
  // The Content-Length the buffered head declares; nullopt without one (or
  // before the head is complete). A value that is not a number reads as
  // nullopt too: httplib then refuses the request itself.
  std::optional<std::uint64_t> DeclaredContentLength() const;
  // TLS only: drives the handshake without blocking; kProgress once done.
  Io Handshake();
  // Reads whatever has arrived, without blocking, into `in` (at most until
  // pending() holds `limit` bytes). kProgress when bytes came, kWouldBlock
  // when none were there, kClosed at EOF or on an error.
  Io ReadAvailable(std::size_t limit);
  // One non-blocking read or write of at most n bytes: > 0 done, 0 EOF
  // (reads), -1 with would_block set (try again when ready) or not (error).
  long RecvSome(char* p, std::size_t n, bool& would_block);
  long SendSome(const char* p, std::size_t n, bool& would_block);
  // Best effort, without blocking: used for the park's own refusals.
  void SendNow(std::string_view bytes);

  const int fd;
  SSL* const ssl;  // null = plaintext
  bool handshaken = false;
  std::string in;
  std::size_t in_off = 0;
  int served = 0;          // requests answered on this connection
  bool draining = false;   // refused (413, 431): input is read and dropped until EOF or the deadline
  bool got_bytes = false;  // bytes of a head arrived since admission / the last response
  HttpClock::time_point deadline{};
};

// One request's view of a Connection for httplib. Reads come from the
// connection's buffer first, then from the socket, waiting at most until
// `read_deadline` (then timed_out() and -1); writes wait at most
// `write_timeout` per blocked write.
class ConnStream final : public httplib::Stream {
 public:
  ConnStream(Connection& c, HttpClock::time_point read_deadline, std::chrono::milliseconds write_timeout)
      : c_(c), read_deadline_(read_deadline), write_timeout_(write_timeout) {}

  bool is_readable() const override;
  bool is_writable() const override;
  ssize_t read(char* ptr, size_t size) override;
  ssize_t write(const char* ptr, size_t size) override;
  void get_remote_ip_and_port(std::string& ip, int& port) const override;
  void get_local_ip_and_port(std::string& ip, int& port) const override;
  socket_t socket() const override { return c_.fd; }

  bool timed_out() const { return timed_out_; }

 private:
  // Waits until the socket is ready for `events` or `until` passes.
  bool WaitFor(short events, HttpClock::time_point until) const;

  Connection& c_;
  const HttpClock::time_point read_deadline_;
  const std::chrono::milliseconds write_timeout_;
  bool timed_out_ = false;
};

}  // namespace epd::internal
