// The test launcher's promise (src/testing/child_process.h): a redis-server a
// test started dies with the test process, even when that process is killed
// with SIGKILL and runs no destructor (as ctest's timeout does). Before the
// launcher set PR_SET_PDEATHSIG, such a server outlived the test and held
// ctest's output pipe open (issue 27, fault 8).
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "redis_server.h"

namespace epd::test_util {
namespace {

// The state letter of /proc/<path>/stat ('R', 'S', 'Z', ...), or 0 when
// there is no such entry.
char State(const std::string& path) {
  std::ifstream stat(path + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return 0;
  const std::size_t close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() ? line[close + 2] : '\0';
}

// Whether process `pid` has not finished exiting. A zombie is gone (dead,
// only not yet reaped by its new parent) once every thread of it is: the
// main thread of a multi-threaded server turns zombie first, while its other
// threads may still be closing its files (its listening socket).
bool Alive(pid_t pid) {
  const std::string dir = "/proc/" + std::to_string(pid);
  const char state = State(dir);
  if (state == 0) return false;
  if (state != 'Z' && state != 'X') return true;
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator(dir + "/task", ec)) {
    const char t = State(task.path().string());
    if (t != 0 && t != 'Z' && t != 'X') return true;
  }
  return false;
}

struct Started {
  pid_t server = -1;
  int port = 0;
};

TEST(RedisHarnessTest, TheServerDiesWithinASecondOfItsKilledTestProcess) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t test = ::fork();
  ASSERT_GE(test, 0);
  if (test == 0) {  // the "test process": starts a server, then waits to be killed
    ::close(fds[0]);
    Started s;
    try {
      RedisServer redis(EPD_REDIS_SERVER);
      s = {redis.pid(), redis.port()};
      (void)!::write(fds[1], &s, sizeof(s));
      for (;;) ::pause();
    } catch (...) {
      (void)!::write(fds[1], &s, sizeof(s));
    }
    std::_Exit(1);
  }
  ::close(fds[1]);
  Started s;
  ASSERT_EQ(::read(fds[0], &s, sizeof(s)), static_cast<ssize_t>(sizeof(s)));
  ::close(fds[0]);
  ASSERT_GT(s.server, 0) << "the child could not start redis-server";
  ASSERT_TRUE(Alive(s.server));

  ::kill(test, SIGKILL);  // no destructor runs: only the kernel can stop redis now
  ASSERT_EQ(::waitpid(test, nullptr, 0), test);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (Alive(s.server) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_FALSE(Alive(s.server)) << "redis-server " << s.server << " outlived its test process by 1 s";
  if (Alive(s.server)) ::kill(s.server, SIGKILL);  // leave nothing behind either way

  // And its port no longer accepts connections.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<std::uint16_t>(s.port));
  EXPECT_NE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ::close(fd);
}

}  // namespace
}  // namespace epd::test_util
