// src/testing/redis_server.h (test-only): a real redis-server of the test's
// own, on a free loopback port, with its working directory in a fresh temp
// dir, persistence off (--save '' --appendonly no), stopped by PID.
//
// Usage:
//   epd::test_util::RedisServer redis(EPD_REDIS_SERVER);   // started
//   std::string url = redis.url();                        // redis://127.0.0.1:<port>
//   redis.Kill();  redis.Restart();                        // fault tests
//   redis.Cli({"CONFIG", "SET", "maxmemory", "1mb"});     // one command, via hiredis-free RESP
//   redis.Cli({"GET", RedisKey("epd:v:", key)});         // a tier's own key for `key`
//
// Started through SpawnDyingWithParent (child_process.h): the server dies
// with the test process even when ctest kills it. The port is found by
// binding port 0 and closing it just before redis starts; a race with another process taking it makes Start() fail
// loudly (it waits for PING), never pass silently.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "child_process.h"
#include "epd/media/content_key.h"

namespace epd::test_util {

// The Redis key a tier stores under for `key`: `prefix` (e.g. "epd:v:" for
// values, "epd:lease:" for leases, with the default RedisTierOptions::key_prefix)
// followed by the key's hex.
inline std::string RedisKey(const char* prefix, const ContentKey& key) { return prefix + key.Hex(); }

class RedisServer {
 public:
  // Starts redis-server (`binary`) with `extra` arguments (e.g. {"--maxmemory", "2mb"}).
  explicit RedisServer(std::string binary, std::vector<std::string> extra = {})
      : binary_(std::move(binary)), extra_(std::move(extra)) {
    char tmpl[] = "/tmp/epd-redis-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir_ = tmpl;
    port_ = FreePort();
    Start();
  }
  ~RedisServer() {
    Kill();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }

  // SIGKILL, as a crash; waits for the process. No-op when not running.
  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  // SIGSTOP / SIGCONT: a Redis that stops answering without closing sockets.
  void Pause() { ::kill(pid_, SIGSTOP); }
  void Resume() { ::kill(pid_, SIGCONT); }
  // Starts it again on the same port (empty: nothing persisted).
  void Restart() {
    Kill();
    Start();
  }

  // Sends one command (inline RESP array) and returns the raw reply bytes.
  std::string Cli(const std::vector<std::string>& argv) const {
    const int fd = Connect();
    std::string req = "*" + std::to_string(argv.size()) + "\r\n";
    for (const std::string& a : argv) req += "$" + std::to_string(a.size()) + "\r\n" + a + "\r\n";
    WriteAll(fd, req);
    std::string reply = ReadReply(fd);
    ::close(fd);
    return reply;
  }

 private:
  static int FreePort() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) throw std::runtime_error("bind failed");
    socklen_t len = sizeof(a);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    ::close(fd);
    return ntohs(a.sin_port);
  }

  int Connect() const {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<std::uint16_t>(port_));
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      ::close(fd);
      return -1;
    }
    return fd;
  }
  static void WriteAll(int fd, const std::string& s) {
    std::size_t off = 0;
    while (off < s.size()) {
      const ssize_t n = ::write(fd, s.data() + off, s.size() - off);
      if (n <= 0) throw std::runtime_error("write to redis failed");
      off += static_cast<std::size_t>(n);
    }
  }
  // Reads one reply: a line, plus a bulk body when it is "$<n>" (n >= 0).
  static std::string ReadReply(int fd) {
    std::string out;
    char c;
    while (out.size() < 2 || out.compare(out.size() - 2, 2, "\r\n") != 0) {
      if (::read(fd, &c, 1) != 1) return out;
      out += c;
    }
    if (out[0] == '$') {
      const long n = std::strtol(out.c_str() + 1, nullptr, 10);
      if (n >= 0) {
        std::string body(static_cast<std::size_t>(n) + 2, '\0');
        std::size_t off = 0;
        while (off < body.size()) {
          const ssize_t r = ::read(fd, body.data() + off, body.size() - off);
          if (r <= 0) break;
          off += static_cast<std::size_t>(r);
        }
        out += body;
      }
    }
    return out;
  }

  void Start() {
    std::vector<std::string> args = {binary_,        "--port",    std::to_string(port_),
                                     "--bind",       "127.0.0.1", "--dir",
                                     dir_,           "--save",    "",
                                     "--appendonly", "no",        "--daemonize",
                                     "no",           "--logfile", dir_ + "/redis.log"};
    args.insert(args.end(), extra_.begin(), extra_.end());
    pid_ = SpawnDyingWithParent(std::move(args));  // dies with the test, even a killed one
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      const int fd = Connect();
      if (fd >= 0) {
        WriteAll(fd, "*1\r\n$4\r\nPING\r\n");
        const std::string r = ReadReply(fd);
        ::close(fd);
        // A server with requirepass answers NOAUTH: up all the same.
        if (r == "+PONG\r\n" || r.rfind("-NOAUTH", 0) == 0) return;
      }
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        throw std::runtime_error("redis-server exited at start (port " + std::to_string(port_) + ")");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    Kill();  // a throwing constructor runs no destructor
    throw std::runtime_error("redis-server did not answer PING within 10 s");
  }

  std::string binary_;
  std::vector<std::string> extra_;
  std::string dir_;
  int port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace epd::test_util
