// src/testing/child_process.h (test-only): starts a server process for a
// test so that it dies with the test, even when the test is killed outright
// (ctest's timeout, a SIGKILL, a crash): the one launcher of the C++ tests
// (src/testing/redis_server.h uses it). The Python tests have theirs in
// tests/python/child_process.py.
//
// How: between fork and exec the child sets PR_SET_PDEATHSIG(SIGKILL), so
// the kernel SIGKILLs it when the thread that forked it ends, and kills
// itself at once when that parent died before prctl ran (getppid() is no
// longer the parent). Caveat: the "parent" is the forking *thread*: start a
// server from a thread that lives as long as the server should (a test
// body, not a short-lived helper thread).
//
// Usage:
//   pid_t pid = epd::test_util::SpawnDyingWithParent({"/usr/bin/redis-server", "--port", "6390"});
//   ...
//   ::kill(pid, SIGKILL); ::waitpid(pid, nullptr, 0);   // the caller reaps it
//
// Errors: std::runtime_error when fork fails. An exec that fails ends the
// child with status 127 (the caller sees it through waitpid).
// Thread safety: callable from any thread; the child runs only
// async-signal-safe calls between fork and exec (argv is built before fork).
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

namespace epd::test_util {

// Forks and execs argv[0] (a path) with `argv`; the child's stdin, stdout
// and stderr are /dev/null (a server must not hold the test runner's
// output pipe open). Returns the child's PID.
inline pid_t SpawnDyingWithParent(std::vector<std::string> argv) {
  if (argv.empty()) throw std::runtime_error("SpawnDyingWithParent: empty argv");
  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (std::string& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(std::string("fork failed: ") + std::generic_category().message(errno));
  if (pid == 0) {
    if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) std::_Exit(126);
    if (::getppid() != parent) ::raise(SIGKILL);  // the parent is already gone
    const int null = ::open("/dev/null", O_RDWR);
    if (null >= 0) {
      ::dup2(null, STDIN_FILENO);
      ::dup2(null, STDOUT_FILENO);
      ::dup2(null, STDERR_FILENO);
      if (null > STDERR_FILENO) ::close(null);
    }
    ::execv(args[0], args.data());
    std::_Exit(127);
  }
  return pid;
}

}  // namespace epd::test_util
