// The decode work bounds (decode_budget.h).
#include "decode_budget.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>

namespace epd::internal {

std::string Num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

Status CheckDecodeWork(std::int64_t frames, std::int64_t width, std::int64_t height, const VideoLimits& limits) {
  if (frames > limits.max_decode_frames) {
    return InvalidArgument("decoding the video takes " + std::to_string(frames) + " frames, over the limit of " +
                           std::to_string(limits.max_decode_frames) + " (max_decode_frames)");
  }
  const double pixels = static_cast<double>(frames) * static_cast<double>(std::max<std::int64_t>(width, 0)) *
                        static_cast<double>(std::max<std::int64_t>(height, 0));
  if (pixels > static_cast<double>(limits.max_decode_pixels)) {
    return InvalidArgument("decoding the video takes " + std::to_string(frames) + " frames of " +
                           std::to_string(width) + "x" + std::to_string(height) + ", " + Num(pixels) +
                           " pixels, over the limit of " + std::to_string(limits.max_decode_pixels) +
                           " (max_decode_pixels)");
  }
  return Status::Ok();
}

DecodeBudget::DecodeBudget(const VideoLimits& limits, std::stop_token stop)
    : limits_(limits), stop_(std::move(stop)), start_(std::chrono::steady_clock::now()) {}

Status DecodeBudget::Charge(std::int64_t width, std::int64_t height) {
  ++frames_;
  pixels_ += static_cast<double>(width) * static_cast<double>(height);
  if (frames_ > limits_.max_decode_frames || pixels_ > static_cast<double>(limits_.max_decode_pixels)) {
    return InvalidArgument("the video decoded to more than its header announced: " + std::to_string(frames_) +
                           " frames, " + Num(pixels_) + " pixels so far, over the limit of " +
                           std::to_string(limits_.max_decode_frames) + " frames (max_decode_frames) or " +
                           std::to_string(limits_.max_decode_pixels) + " pixels (max_decode_pixels)");
  }
  return Between();
}

Status DecodeBudget::Between() const {
  if (stop_.stop_requested()) {
    return Cancelled("the video decode was stopped after " + std::to_string(frames_) + " frames: its request ended");
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (seconds > limits_.max_decode_seconds) {
    return InvalidArgument("decoding the video took over " + Num(limits_.max_decode_seconds) +
                           " s (max_decode_seconds); stopped after " + std::to_string(frames_) + " frames");
  }
  return Status::Ok();
}

}  // namespace epd::internal
