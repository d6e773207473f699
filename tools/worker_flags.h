// tools/worker_flags.h: the flags every subcommand that runs an EncodeWorker
// shares (replay here, serve in serve_command.cc), and the one function that
// turns them into a worker with its tower loaded.
//
// Flags (defaults in brackets):
//   --model PATH              a Hugging Face checkpoint directory (Qwen2-VL,
//                             Qwen2.5-VL, Qwen3-VL; epd/checkpoint_tower/checkpoint_tower.h) or
//                             a TorchScript tower file [the default model, a
//                             small random Qwen2.5-VL checkpoint: for an
//                             installed epd-encode, share/epd/models/
//                             default-qwen2_5_vl of its prefix; else the one
//                             the build writes to build/models/default-qwen2_5_vl]
//   --model-id ID             hashed into every content key [a checkpoint's
//                             model id (epd/model/checkpoint.h); a TorchScript
//                             file's name]
//   --threads N               tower intra-op threads, 0 = all cores [0]
//   --device cpu|cuda[:N]     where the tower runs [cpu]. On cuda, in a build
//                             with EPD_WITH_CUDA, the GPU tier is used: the
//                             tower's output stays in VRAM, L1 (--cache-mb)
//                             lives in VRAM and L2 (--host-cache-mb) in a
//                             pinned host pool (docs/GPU.md). Without
//                             EPD_WITH_CUDA the tower runs on the GPU and
//                             both tiers stay in host memory.
//   --dtype float32|bfloat16  embedding dtype [float32]
//   --cache-mb MB             L1 cache capacity [1024]
//   --host-cache-mb MB        L2 (host) cache capacity [4096]
//   --no-cache                caching and in-flight dedup off (baselines)
//   --eviction lru|gdsf|adaptive  eviction of L1 and L2 [lru, the reference's];
//                             gdsf ranks by measured encode cost per byte;
//                             adaptive takes LRU's, GDSF's or probation's
//                             victim, whichever an online miniature of each
//                             saves the most with
//   --l1-admission none|doorkeeper
//                             L1 admission filter [none]; doorkeeper: L1 on a
//                             key's second request in a window, L2 on its first
//   --l1-admission-window N   the doorkeeper's window, requests [65536; at most
//                             2^27, as plan's --window]
//   --max-tokens-per-batch N  tower batch token budget [8192]
//   --max-items-per-batch N   tower batch item bound [16]
//   --order fifo|by_key|fair  scheduler order [fifo; serve: fair]
//   --max-pixels N            preprocessing area cap, pixels [a checkpoint's
//                             preprocessor_config.json; 1003520, Qwen2-VL's
//                             default, for TorchScript]. A checkpoint's other
//                             preprocessing fields come from its config too.
//   --decode-threads N        helper threads decoding misses ahead of the tower [1]
//   --exif-orientation on|off apply the EXIF Orientation tag, as
//                             PIL.ImageOps.exif_transpose [on]; in the key
//   --rgba-background white|none|R,G,B
//                             background RGBA images are composited onto
//                             (vLLM's default, white), or none to drop alpha
//                             like convert("RGB") [white]; in the key
//   --max-decode-pixels N     largest stored image accepted, pixels
//                             [178956970, Pillow's DecompressionBombError
//                             threshold]; not in the key
//   --l3 URL, --l3-*          the shared L3 tier on Redis (l3_flags.h)
//   --tenant-quota NAME=L1MB/L2MB, --tenant-quota-default L1MB/L2MB
//                             per-tenant cache reservations (tenant_quota_flags.h)
//
// Thread safety: not thread-safe (parse-time helpers).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <string>

#include "epd/core/status.h"
#include "epd/gpu/device.h"
#include "epd/worker/encode_worker.h"
#include "l3_flags.h"
#include "tenant_quota_flags.h"

namespace epd::cli {

struct WorkerFlags {
  std::string model;
  std::string model_id;
  int threads = 0;
  std::string device = "cpu";
  std::string dtype = "float32";
  double cache_mb = 1024;
  double host_cache_mb = 4096;
  bool no_cache = false;
  std::string eviction = "lru";              // WorkerOptions::eviction
  std::string l1_admission = "none";         // WorkerOptions::l1_admission
  std::int64_t l1_admission_window = 65536;  // WorkerOptions::l1_admission_window
  std::int64_t max_tokens_per_batch = 8192;
  std::int64_t max_items_per_batch = 16;
  std::string order = "fifo";
  std::int64_t max_pixels = 0;  // 0: the model's (see --max-pixels)
  int decode_threads = WorkerOptions{}.decode_threads;
  std::int64_t max_video_decodes_per_tenant = WorkerOptions{}.max_video_decodes_per_tenant;
  std::string exif_orientation = "on";
  std::string rgba_background = "white";
  std::int64_t max_decode_pixels = DecodeLimits{}.max_pixels;
  L3Flags l3;
  TenantQuotaFlags quotas;
  // Videos (docs/VIDEO.md): the default sampling (the rest is qwen-vl-utils'
  // for the model's patch size, VideoSampling::ForPatchSize) and limits.
  double video_fps = VideoSampling{}.fps;
  std::int64_t video_max_frames = VideoSampling{}.max_frames;
  double video_max_seconds = VideoLimits{}.max_duration_s;
  // The decode work one video may cost (VideoLimits::max_decode_*).
  std::int64_t video_max_decode_frames = VideoLimits{}.max_decode_frames;
  std::int64_t video_max_decode_pixels = VideoLimits{}.max_decode_pixels;
  double video_max_decode_seconds = VideoLimits{}.max_decode_seconds;
  std::string video_rotation = "on";  // VideoSampling::apply_rotation: "on" or "off"
  bool no_video_chunk_cache = false;  // WorkerOptions::video_chunk_cache off (to measure what it saves)
};

// The tower used when --model is not given; empty when this build has none.
std::string DefaultModelPath();

// Adds the flags above to `cmd`, writing into `flags` (which must outlive it).
void AddWorkerFlags(CLI::App& cmd, WorkerFlags& flags);

// What MakeWorker builds before it creates the worker: `options` with the
// flags applied, and the loaded tower. For callers that create the worker
// themselves (EncodeServer::Start installs its own sink_full and wraps the
// tower). Same errors as MakeWorker.
struct WorkerParts {
  WorkerOptions options;
  std::unique_ptr<VisionTower> tower;
  // The GPU tier's device (--device cuda in a CUDA build; never closed, see
  // worker_flags.cc); null when the tiers live in host memory. For CUDA IPC
  // delivery (ServerOptions::ipc_device).
  Device* device = nullptr;
};
StatusOr<WorkerParts> MakeWorkerParts(const WorkerFlags& flags, WorkerOptions options = {});

// Loads the tower and creates the worker. `options` supplies every field the
// flags do not set (sink_full, copies, max_pending_items, ...). Errors: the
// tower's load error (kInvalidArgument for a bad --device,
// kFailedPrecondition when CUDA is not usable), kInvalidArgument for bad flag
// combinations, or kFailedPrecondition when this build has no TorchScript
// backend. With --device cuda and the GPU tier, the CUDA device is opened
// once per process and never closed (see worker_flags.cc).
StatusOr<std::unique_ptr<EncodeWorker>> MakeWorker(const WorkerFlags& flags, WorkerOptions options = {});

}  // namespace epd::cli
