// src/worker/held_decoder.h (test-only): a decode_video whose decodes the
// test holds and releases, so that a test makes a decode slow
// deterministically instead of with sleeps that depend on the machine.
//
// It decodes the clips of video_test_clips.h (FakeDecode). A container
// "hold:<clip>" first waits until Release() (or until its stop token is
// requested: then kCancelled, as DecodeVideo between two frames). The wait is
// bounded (`bound`, kBound by default), so on code that decodes on the owning
// thread a test fails rather than hangs.
//
// Thread safety: thread-safe (decodes run on the worker's decode threads).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <span>
#include <stop_token>
#include <string>

#include "epd/worker/worker_options.h"
#include "video_test_clips.h"

namespace epd::testing {

inline constexpr std::chrono::seconds kBound{5};  // how long a held decode or a test's wait lasts at most

class HeldDecoder {
 public:
  explicit HeldDecoder(std::chrono::milliseconds bound = kBound) : bound_(bound) {}

  VideoDecodeFn Fn() {
    return [this](std::span<const std::uint8_t> bytes, const VideoSampling&, const PreprocessConfig& cfg,
                  const VideoLimits&, const std::stop_token& stop) { return Decode(bytes, cfg, stop); };
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    cv_.notify_all();
  }
  int calls() const { return calls_.load(); }
  int max_held() {
    std::lock_guard<std::mutex> lock(mu_);
    return max_held_;
  }
  // Decodes waiting for Release() now.
  int held() {
    std::lock_guard<std::mutex> lock(mu_);
    return held_;
  }
  // Waits until `n` decodes are held; false after kBound.
  bool AwaitHeld(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, kBound, [&] { return held_ >= n; });
  }
  // Waits until a held decode has seen its stop token; false after kBound.
  bool AwaitStopSeen() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, kBound, [&] { return stops_seen_ > 0; });
  }

 private:
  StatusOr<SampledVideo> Decode(std::span<const std::uint8_t> bytes, const PreprocessConfig& cfg,
                                const std::stop_token& stop) {
    std::string s(bytes.begin(), bytes.end());
    if (s.rfind("hold:", 0) == 0) {
      s = s.substr(5);
      std::unique_lock<std::mutex> lock(mu_);
      max_held_ = std::max(max_held_, ++held_);
      cv_.notify_all();
      cv_.wait_for(lock, stop, bound_, [&] { return released_; });
      --held_;
      if (!released_ && stop.stop_requested()) {
        ++stops_seen_;
        cv_.notify_all();
        return Cancelled("stopped before its next frame");
      }
    }
    const std::span<const std::uint8_t> clip(reinterpret_cast<const std::uint8_t*>(s.data()), s.size());
    return FakeDecode(clip, cfg, &calls_);
  }

  const std::chrono::milliseconds bound_;
  std::atomic<int> calls_{0};
  std::mutex mu_;
  std::condition_variable_any cv_;
  bool released_ = false;
  int held_ = 0;
  int max_held_ = 0;
  int stops_seen_ = 0;
};

}  // namespace epd::testing
