// src/video/decode_budget.h (internal to epd::video): the decode work one
// video may cost (VideoLimits::max_decode_frames, max_decode_pixels,
// max_decode_seconds) and the stop token of its request, checked on the
// header before decoding and between frames during it (docs/VIDEO.md,
// "Decode work").
//
// Thread safety: CheckDecodeWork is a pure function; one DecodeBudget belongs
// to one decode on one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <stop_token>
#include <string>

#include "epd/core/status.h"
#include "epd/media/video.h"

namespace epd::internal {

// `v` as printf's %.6g writes it, for the limits' messages.
std::string Num(double v);

// The decode work of `frames` frames of width x height pixels against
// limits.max_decode_frames and limits.max_decode_pixels. A count or size of
// 0 (not known yet) passes. Errors: kInvalidArgument naming the limit passed.
Status CheckDecodeWork(std::int64_t frames, std::int64_t width, std::int64_t height, const VideoLimits& limits);

// The decode work spent so far. `limits` must outlive the budget.
class DecodeBudget {
 public:
  DecodeBudget(const VideoLimits& limits, std::stop_token stop);

  // Charges one decoded frame of width x height pixels, then checks as
  // Between does. Errors: kInvalidArgument once the frames or pixels actually
  // decoded pass the limits (a stream whose frames grow past what its header
  // said), or Between's.
  Status Charge(std::int64_t width, std::int64_t height);

  // Before the next packet or frame. Errors: kCancelled once the stop token
  // is requested (the video's request ended); kInvalidArgument once the
  // decode has run longer than limits.max_decode_seconds.
  Status Between() const;

 private:
  const VideoLimits& limits_;
  const std::stop_token stop_;
  const std::chrono::steady_clock::time_point start_;
  std::int64_t frames_ = 0;
  double pixels_ = 0;
};

}  // namespace epd::internal
