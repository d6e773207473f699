// WorkerOptions::Validate (the option checks that need no tower) and
// ValidateFor (those that do).
#include "epd/worker/worker_options.h"

#include <cmath>
#include <string>
#include <utility>

#include "epd/core/embedding_cache.h"

namespace epd {

Status WorkerOptions::Validate() const {
  if (model_id.empty()) return InvalidArgument("model_id is empty");
  if (Status s = preprocess.Validate(); !s.ok()) return InvalidArgument("preprocess: " + s.message());
  if (limits.max_pixels <= 0) {
    return InvalidArgument("limits.max_pixels must be > 0, got " + std::to_string(limits.max_pixels));
  }
  for (const auto& [name, bytes] :
       {std::pair{"l1_capacity_bytes", l1_capacity_bytes}, std::pair{"l2_capacity_bytes", l2_capacity_bytes}}) {
    if (bytes < 0 || bytes > kMaxCacheBytes) return CacheBytesOutOfRange(name, bytes < 0, std::to_string(bytes));
  }
  if (max_tokens_per_batch <= 0) {
    return InvalidArgument("max_tokens_per_batch must be > 0, got " + std::to_string(max_tokens_per_batch));
  }
  // The doorkeeper takes about 6 bytes per windowed request: 2^27 is 0.8 GB.
  if (l1_admission_window < 1 || l1_admission_window > (std::uint64_t{1} << 27)) {
    return InvalidArgument("l1_admission_window must be in [1, 2^27] requests, got " +
                           std::to_string(l1_admission_window));
  }
  if (max_items_per_batch <= 0) {
    return InvalidArgument("max_items_per_batch must be > 0, got " + std::to_string(max_items_per_batch));
  }
  if (max_pending_items < 0) {
    return InvalidArgument("max_pending_items must be >= 0, got " + std::to_string(max_pending_items));
  }
  if (decode_threads < 0) {
    return InvalidArgument("decode_threads must be >= 0, got " + std::to_string(decode_threads));
  }
  if (decode_lookahead < 0) {
    return InvalidArgument("decode_lookahead must be >= 0, got " + std::to_string(decode_lookahead));
  }
  if (max_video_decodes_per_tenant < 0) {
    return InvalidArgument("max_video_decodes_per_tenant must be >= 0 (0 = unbounded), got " +
                           std::to_string(max_video_decodes_per_tenant));
  }
  if (!(std::isfinite(promote_seconds_per_byte) && promote_seconds_per_byte >= 0)) {
    return InvalidArgument("promote_seconds_per_byte must be finite and >= 0, got " +
                           std::to_string(promote_seconds_per_byte));
  }
  return Status::Ok();
}

Status WorkerOptions::ValidateFor(const VisionTower& tower) const {
  if (Status s = Validate(); !s.ok()) return s;
  if (tower.patch_dim() != preprocess.patch_dim()) {
    return InvalidArgument("tower patch_dim " + std::to_string(tower.patch_dim()) +
                           " differs from the preprocess config's " + std::to_string(preprocess.patch_dim()));
  }
  if (tower.merge_size() != preprocess.merge_size) {
    return InvalidArgument("tower merge_size " + std::to_string(tower.merge_size()) +
                           " differs from the preprocess config's " + std::to_string(preprocess.merge_size));
  }
  if (tower.output_on_device() && (!adopt_device_rows || !to_host || !to_device)) {
    // Without to_host an L1 victim in VRAM would move to L2 as it is, so the
    // VRAM in use could reach l1_capacity_bytes + l2_capacity_bytes.
    return InvalidArgument("tower '" + tower.Describe() + "' leaves its output in device memory, but " +
                           (!adopt_device_rows ? "adopt_device_rows"
                            : !to_host         ? "to_host"
                                               : "to_device") +
                           " is not set (take all three hooks from the GPU tier: MakeEmbeddingTierHooks)");
  }
  return Status::Ok();
}

}  // namespace epd
