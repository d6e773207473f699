// tools/exit_deadline.h: a backstop that ends the process if a scope
// outlives its time budget.
//
// `epd-encode serve` promises to exit within --grace-s + 1 s of SIGTERM
// whatever clients do (docs/SERVER.md). EncodeServer::Shutdown keeps that
// promise on its own for the gRPC side; this covers what it cannot bound,
// e.g. a tower batch still running on the worker thread. Armed on
// construction; if the destructor has not run `budget` later, it logs
// `message` and calls std::_Exit(exit_code) (no destructors, no atexit).
//
// Thread safety: one owner; the watcher thread is internal.
#pragma once

#include <spdlog/spdlog.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

namespace epd::cli {

class ExitDeadline {
 public:
  ExitDeadline(std::chrono::milliseconds budget, std::string message, int exit_code = 0)
      : watcher_([this, budget, message = std::move(message), exit_code] {
          std::unique_lock<std::mutex> lock(mu_);
          if (!cv_.wait_for(lock, budget, [this] { return done_; })) {
            spdlog::error("{}", message);
            std::_Exit(exit_code);
          }
        }) {}
  ~ExitDeadline() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    watcher_.join();
  }
  ExitDeadline(const ExitDeadline&) = delete;
  ExitDeadline& operator=(const ExitDeadline&) = delete;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;    // guarded by mu_
  std::thread watcher_;  // last: starts after the members it reads
};

}  // namespace epd::cli
