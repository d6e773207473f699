// src/openai/kwargs_check.h (internal): per-request processing options that
// would publish an embedding under an id it does not belong to.
//
// An id (uuid) names one embedding; a request that changes how its media
// is processed must not get a file under that id made with other settings.
// So:
//   media_io_kwargs   accepted when every setting equals this server's:
//                     {"video": {"fps": F}} (the server's --video-fps, when
//                     it samples by fps) and {"video": {"num_frames": N}}
//                     (when it samples a fixed count); anything else is
//                     refused, naming the key.
//   mm_processor_kwargs  accepted only when absent, null or {}. Keys this
//                     server can compare (min_pixels, max_pixels, size.
//                     {shortest_edge, longest_edge}, patch_size, merge_size,
//                     temporal_patch_size, fps) that differ are refused as
//                     changing the embedding; unknown keys as settings it
//                     cannot match; and equal ones too, because vLLM's
//                     processor keys an item by hash(uuid, mm_processor_
//                     kwargs) when they are non-empty
//                     (BaseMultiModalProcessor._hash_mm_items), so the
//                     consumer would look for a file under another name
//                     (docs/VLLM.md, "Where vLLM's code and the issue differ").
// Every refusal is a 400 (code processing_kwargs_refused) naming the keys.
//
// Thread safety: a pure function.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>

#include "epd/worker/encode_worker.h"
#include "front_error.h"

namespace epd::internal {

std::optional<FrontError> CheckProcessingKwargs(const nlohmann::json& mm_processor_kwargs,
                                                const nlohmann::json& media_io_kwargs, const WorkerOptions& server);

}  // namespace epd::internal
