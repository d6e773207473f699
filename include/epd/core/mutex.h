// epd/core/mutex.h: std::mutex and std::condition_variable, with the
// annotations clang's thread-safety analysis reads.
//
// libstdc++'s std::mutex carries no capability attribute, so a field cannot
// be EPD_GUARDED_BY one. `Mutex` is a std::mutex that can; `MutexLock` is its
// scoped lock (a std::unique_lock that the analysis follows, Unlock and Lock
// included); `CondVar` waits on a Mutex the caller holds. Under GCC they
// compile to the std calls they wrap.
//
//   Mutex mu_;
//   int pending_ EPD_GUARDED_BY(mu_) = 0;
//   CondVar cv_;
//   MutexLock lock(mu_);
//   while (pending_ > 0) cv_.Wait(mu_);  // a loop, not a predicate: see below
//
// A wait takes no predicate: a lambda is analysed as a function of its own,
// which holds no lock, so the condition is a loop at the caller, where the
// analysis sees the lock held. Thread safety: all three are thread-safe, as
// the std types are; none is copyable or movable.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "epd/core/thread_annotations.h"

namespace epd {

class EPD_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() EPD_ACQUIRE() { mu_.lock(); }
  void unlock() EPD_RELEASE() { mu_.unlock(); }
  bool try_lock() EPD_TRY_ACQUIRE(true) { return mu_.try_lock(); }
  // Tells the analysis the caller holds it (checks nothing at run time).
  void AssertHeld() const EPD_ASSERT_HELD(this) {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

class EPD_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) EPD_ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  ~MutexLock() EPD_RELEASE() {
    if (held_) mu_.unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  // REQUIRES: held. Lets go before the scope ends (e.g. to run a callback).
  void Unlock() EPD_RELEASE() {
    mu_.unlock();
    held_ = false;
  }
  // REQUIRES: not held (after Unlock).
  void Lock() EPD_ACQUIRE() {
    mu_.lock();
    held_ = true;
  }

 private:
  Mutex& mu_;
  bool held_ = true;
};

class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  void NotifyOne() noexcept { cv_.notify_one(); }
  void NotifyAll() noexcept { cv_.notify_all(); }

  // Each wait releases `mu`, sleeps until notified (or spuriously, or at the
  // deadline) and holds `mu` again when it returns, also by an exception.
  void Wait(Mutex& mu) EPD_REQUIRES(mu) {
    Adopted lock(mu);
    cv_.wait(lock.lock);
  }
  template <class Clock, class Duration>
  std::cv_status WaitUntil(Mutex& mu, const std::chrono::time_point<Clock, Duration>& deadline) EPD_REQUIRES(mu) {
    Adopted lock(mu);
    return cv_.wait_until(lock.lock, deadline);
  }
  template <class Rep, class Period>
  std::cv_status WaitFor(Mutex& mu, const std::chrono::duration<Rep, Period>& timeout) EPD_REQUIRES(mu) {
    Adopted lock(mu);
    return cv_.wait_for(lock.lock, timeout);
  }

 private:
  // The caller's hold on `mu`, lent to the std wait and never unlocked here.
  struct Adopted {
    explicit Adopted(Mutex& mu) : lock(mu.mu_, std::adopt_lock) {}
    ~Adopted() { lock.release(); }
    std::unique_lock<std::mutex> lock;
  };
  std::condition_variable cv_;
};

}  // namespace epd
