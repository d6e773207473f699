// src/media/patchify.h (internal to epd::media): the Qwen2-VL patch layout,
// separated from resize/normalise so a test can feed it distinct floats.
//
// Thread safety: pure function; thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "epd/preprocess.h"

namespace epd::internal {

// `planar` is one normalised frame, [3, height, width] float32 (channel
// planes). Returns [gh * gw, 3 * T * P * P] rows in the layout documented at
// epd::Preprocess, the frame repeated T = cfg.temporal_patch_size times.
// REQUIRES: cfg valid; height and width multiples of cfg.factor();
// planar.size() == 3 * height * width.
std::vector<float> Patchify(const std::vector<float>& planar, int height, int width, const PreprocessConfig& cfg);

}  // namespace epd::internal
