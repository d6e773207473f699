// src/http/http_test_util.h (test-only): raw loopback sockets for the HTTP
// tests: connect, send, read a whole response, tell whether the server has
// closed a connection.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <string>

namespace epd::testing_http {

// A blocking TCP connection to 127.0.0.1:port with a 60 s receive bound, so
// a broken endpoint fails a test instead of hanging it; -1 on failure.
inline int Connect(int port, const char* ip = "127.0.0.1") {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  inet_pton(AF_INET, ip, &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  timeval tv{60, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

inline bool SendAll(int fd, const std::string& s) {
  return send(fd, s.data(), s.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(s.size());
}

// Reads one response (head, then Content-Length bytes of body).
inline std::string ReadResponse(int fd) {
  std::string got;
  char buf[4096];
  std::size_t need = std::string::npos;
  while (got.size() < need) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    got.append(buf, static_cast<std::size_t>(n));
    const std::size_t head_end = got.find("\r\n\r\n");
    if (need == std::string::npos && head_end != std::string::npos) {
      const std::size_t cl = got.find("Content-Length: ");
      const std::size_t len = cl == std::string::npos || cl > head_end ? 0 : std::stoul(got.substr(cl + 16));
      need = head_end + 4 + len;
    }
  }
  return got;
}

// One request on a fresh connection, "Connection: close".
inline std::string Exchange(int port, const std::string& request) {
  const int fd = Connect(port);
  if (fd < 0) return "";
  SendAll(fd, request);
  std::string out = ReadResponse(fd);
  close(fd);
  return out;
}

// True when the server has closed `fd` (EOF readable within wait_ms).
inline bool ClosedByServer(int fd, int wait_ms = 0) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, wait_ms) <= 0) return false;
  char c;
  return recv(fd, &c, 1, MSG_DONTWAIT | MSG_PEEK) == 0;
}

}  // namespace epd::testing_http
