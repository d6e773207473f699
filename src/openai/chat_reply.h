// src/openai/chat_reply.h (internal): the reply vLLM's EPD proxy reads from
// its encoder.
//
// An OpenAI chat.completion object (one empty assistant choice,
// finish_reason "stop", usage.prompt_tokens = the items' post-merge tokens)
// plus the top-level "ec_transfer_params" that vLLM's producer connectors
// report from request_finished() (collect_ec_item_metadata in
// vllm/distributed/ec_transfer/ec_connector/utils.py), one entry per
// published id:
//   "<id>": {"metadata": {<placeholder metadata>}, "item_indices": [i, ...]}
// item_indices are the item's positions in the request (several when
// identical items share one id). The metadata is what the model declares
// (placeholder_metadata_fields): for an image {"image_grid_thw": [t, h, w]},
// for a video {"video_grid_thw": [t, h, w]}, and for Qwen3-VL's videos
// (towers with deepstack layers) also "timestamps": one time per temporal
// patch, seconds, the mean of its two sampled frames' times (vLLM's
// Qwen3VLProcessingInfo._calculate_timestamps). The grid is per item as
// vLLM's connector writes it (a flat [t, h, w]: the feature's own
// image_grid_thw row); the proxy flattens [[t, h, w]] the same way.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "chat_request.h"
#include "epd/core/grid.h"
#include "epd/http/http_endpoint.h"

namespace epd::internal {

struct PublishedItem {
  std::string id;
  MediaKind kind = MediaKind::kImage;
  GridTHW grid;
  std::vector<double> timestamps;  // Qwen3-VL videos; empty otherwise
  std::vector<std::int64_t> indices;
};

HttpResponse ChatCompletion(const std::string& completion_id, const std::string& model, std::int64_t created_s,
                            const std::vector<PublishedItem>& items, std::int64_t prompt_tokens);

// One time per temporal patch: the mean of the times of the
// `temporal_patch` frames it folds (the last frame repeated to fill it).
std::vector<double> PatchTimestamps(const std::vector<double>& frame_times_s, std::int64_t grid_t,
                                    std::int64_t temporal_patch);

}  // namespace epd::internal
