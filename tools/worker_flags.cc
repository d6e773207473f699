#include "worker_flags.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "epd/core/embedding_cache.h"
#include "flag_checks.h"

#ifdef EPD_HAVE_TORCH_TOWER
#include "epd/checkpoint_tower/checkpoint_tower.h"
#endif
#ifdef EPD_HAVE_VIDEO
#include "epd/video/video_decoder.h"
#endif
#ifdef EPD_HAVE_CUDA_TIER
#include <cstdlib>
#include <mutex>

#include "epd/gpu/device_tier.h"
#include "epd/gpu_cuda/cuda_device.h"
#endif

namespace epd::cli {

std::string DefaultModelPath() {
#ifdef EPD_DEFAULT_MODEL_DIR
  // The default model is the Qwen2.5-VL checkpoint directory the build writes
  // (src/tower/CMakeLists.txt). An installed epd-encode (cmake --install)
  // finds it installed beside it, EPD_INSTALLED_MODELS_DIR relative to its own
  // directory; one run from the build tree, the directory the build made.
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const std::filesystem::path installed =
        exe.parent_path() / EPD_INSTALLED_MODELS_DIR / std::filesystem::path(EPD_DEFAULT_MODEL_DIR).filename();
    if (std::filesystem::is_directory(installed, ec)) return installed.lexically_normal().string();
  }
  return EPD_DEFAULT_MODEL_DIR;
#else
  return "";
#endif
}

namespace {

// AddWorkerFlags' groups, registered in the order below (--help lists them so).
// The tower: which model, where it runs, the embeddings' dtype.
void AddModelFlags(CLI::App& cmd, WorkerFlags& f) {
  f.model = DefaultModelPath();
  cmd.add_option("--model", f.model,
                 "Hugging Face checkpoint directory (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) or TorchScript tower file "
                 "(docs/TOWER.md)")
      ->capture_default_str();
  cmd.add_option("--model-id", f.model_id,
                 "model id hashed into the content keys [a checkpoint's digest; a TorchScript file's name]");
  cmd.add_option("--threads", f.threads, "tower intra-op threads, 0 = all cores")
      ->capture_default_str()
      ->check(Integer(0, 1024));
  cmd.add_option("--device", f.device, "where the tower runs: cpu, cuda or cuda:N (with a CUDA build, L1 in VRAM)")
      ->capture_default_str();
  cmd.add_option("--dtype", f.dtype, "embedding dtype")
      ->capture_default_str()
      ->check(CLI::IsMember({"float32", "bfloat16"}));
}

// L1 and L2: capacities, eviction and admission.
void AddCacheFlags(CLI::App& cmd, WorkerFlags& f) {
  cmd.add_option("--cache-mb", f.cache_mb, "L1 cache capacity, MiB (2^20 bytes)")
      ->capture_default_str()
      ->check(NonNegative("MiB"));
  cmd.add_option("--host-cache-mb", f.host_cache_mb, "L2 (host) cache capacity, MiB (2^20 bytes)")
      ->capture_default_str()
      ->check(NonNegative("MiB"));
  cmd.add_flag("--no-cache", f.no_cache, "turn caching and in-flight deduplication off (baseline runs)");
  cmd.add_option(
         "--eviction", f.eviction,
         "eviction of L1 and L2: lru (the reference's), gdsf (by measured encode cost per byte) or "
         "adaptive (the victim of LRU, GDSF or GDSF with probation, whichever a miniature of each saves the most "
         "with; docs/PLAN.md)")
      ->capture_default_str()
      ->check(CLI::IsMember({"lru", "gdsf", "adaptive"}));
  cmd.add_option("--l1-admission", f.l1_admission,
                 "L1 admission: none, or doorkeeper (a key enters L1 on its second request within a window, L2 on "
                 "its first)")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "doorkeeper"}));
  // The doorkeeper takes about 6 bytes per windowed request (admission_filter.h): 2^27 is 0.8 GB.
  cmd.add_option("--l1-admission-window", f.l1_admission_window,
                 "the doorkeeper's window, requests (plan's --window; at most 2^27)")
      ->capture_default_str()
      ->check(Integer(1, std::int64_t{1} << 27));
}

// Tower batches, their order, and decoding and preprocessing of images.
void AddBatchAndDecodeFlags(CLI::App& cmd, WorkerFlags& f) {
  cmd.add_option("--max-tokens-per-batch", f.max_tokens_per_batch, "tower batch token budget")
      ->capture_default_str()
      ->check(Integer(1));
  cmd.add_option("--max-items-per-batch", f.max_items_per_batch, "tower batch item bound")
      ->capture_default_str()
      ->check(Integer(1));
  cmd.add_option("--order", f.order,
                 "scheduler order: fifo, by_key (the reference) or fair (across clients, docs/SERVER.md)")
      ->capture_default_str()
      ->check(CLI::IsMember({"fifo", "by_key", "fair"}));
  cmd.add_option("--max-pixels", f.max_pixels,
                 "preprocessing area cap, pixels [a checkpoint's max_pixels; 1003520 for TorchScript]")
      ->check(Integer(1));
  cmd.add_option("--decode-threads", f.decode_threads, "helper threads decoding misses ahead of the tower")
      ->capture_default_str()
      ->check(Integer(0, 256));
  cmd.add_option("--video-max-decodes-per-tenant", f.max_video_decodes_per_tenant,
                 "videos: most decodes one tenant may have queued or running; a request that would start more is "
                 "refused with RESOURCE_EXHAUSTED (0: no cap)")
      ->capture_default_str()
      ->check(Integer(0));
  cmd.add_option("--exif-orientation", f.exif_orientation,
                 "apply the EXIF Orientation tag as PIL.ImageOps.exif_transpose (part of the content key)")
      ->capture_default_str()
      ->check(CLI::IsMember({"on", "off"}));
  cmd.add_option("--rgba-background", f.rgba_background,
                 "colour RGBA images are composited onto: white (vLLM's default), none (drop alpha like "
                 "convert('RGB')) or R,G,B (part of the content key)")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](std::string& text) {
            StatusOr<AlphaPolicy> policy = ParseAlphaPolicy(text);
            return policy.ok() ? std::string() : std::string(policy.status().message());
          },
          "white|none|R,G,B"));
  cmd.add_option("--max-decode-pixels", f.max_decode_pixels,
                 "largest stored image accepted, pixels (decompression-bomb guard; default Pillow's error threshold)")
      ->capture_default_str()
      ->check(Integer(1));
}

// Videos' default sampling, their decode limits and chunk caching.
void AddVideoFlags(CLI::App& cmd, WorkerFlags& f) {
  cmd.add_option("--video-fps", f.video_fps, "videos: default sampled frames per second (a request may override)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd.add_option("--video-max-frames", f.video_max_frames, "videos: default most sampled frames per video")
      ->capture_default_str()
      ->check(Integer(2));
  cmd.add_option("--video-max-seconds", f.video_max_seconds, "videos: longest duration a container may claim, s")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd.add_option("--video-max-decode-frames", f.video_max_decode_frames,
                 "videos: most frames one video's decode may produce (all frames up to the last sampled one)")
      ->capture_default_str()
      ->check(Integer(1));
  cmd.add_option("--video-max-decode-pixels", f.video_max_decode_pixels,
                 "videos: most source pixels one video's decode may produce (frames x width x height)")
      ->capture_default_str()
      ->check(Integer(1));
  cmd.add_option("--video-max-decode-seconds", f.video_max_decode_seconds,
                 "videos: longest one video's decode may run, s (stopped between frames)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd.add_option("--video-rotation", f.video_rotation,
                 "videos: show frames as the container's display matrix says, as ffmpeg autorotates (a request "
                 "may override; part of the video key)")
      ->capture_default_str()
      ->check(CLI::IsMember({"on", "off"}));
  cmd.add_flag("--no-video-chunk-cache", f.no_video_chunk_cache,
               "videos: encode and cache each video whole, not per temporal chunk (to measure what chunks save)");
}

}  // namespace

void AddWorkerFlags(CLI::App& cmd, WorkerFlags& f) {
  AddModelFlags(cmd, f);
  AddCacheFlags(cmd, f);
  AddBatchAndDecodeFlags(cmd, f);
  AddL3Flags(cmd, f.l3);
  AddTenantQuotaFlags(cmd, f.quotas);
  AddVideoFlags(cmd, f);
}

#ifdef EPD_HAVE_CUDA_TIER
namespace {

// The process's CUDA device for the GPU tier (OpenGpuTier, sized for L1
// and L2), opened on first use and never closed: every worker, cached entry
// and delivered result must be destroyed before their Device, and for a
// command-line process the only point after all of them is its exit.
// Thread-safe; later calls return the first device (a process uses one GPU).
StatusOr<Device*> ProcessCudaDevice(int index, std::size_t l1_bytes, std::size_t l2_bytes) {
  static std::mutex mu;
  static Device* device = nullptr;
  std::lock_guard<std::mutex> lock(mu);
  if (device != nullptr) return device;
  StatusOr<std::unique_ptr<Device>> opened = OpenGpuTier(index, l1_bytes, l2_bytes);
  if (!opened.ok()) return opened.status();
  device = opened->release();
  return device;
}

// "cuda" -> 0, "cuda:N" -> N; the tower has already validated the string.
int CudaIndex(const std::string& device) {
  const std::size_t colon = device.find(':');
  return colon == std::string::npos ? 0 : std::atoi(device.c_str() + colon + 1);
}

}  // namespace
#endif

namespace {

// At most what the cache's byte counter holds (epd::kMaxCacheBytes), checked
// before the conversion to bytes, which would overflow.
Status CheckCacheSizes(const WorkerFlags& f) {
  for (const auto& [flag, mb] : {std::pair{"--cache-mb", f.cache_mb}, std::pair{"--host-cache-mb", f.host_cache_mb}}) {
    if (mb > static_cast<double>(kMaxCacheBytes >> 20)) {
      char got[32];
      std::snprintf(got, sizeof(got), "%g", mb);
      return InvalidArgument(std::string(flag) + ": at most " + std::to_string(kMaxCacheBytes >> 20) +
                             " MiB (what the cache's byte counter holds), got " + got);
    }
  }
  return Status::Ok();
}

// L1's (`host` false) or L2's capacity in bytes; 0 with --no-cache.
std::int64_t CacheBytes(const WorkerFlags& f, bool host) {
  if (f.no_cache) return 0;
  return static_cast<std::int64_t>((host ? f.host_cache_mb : f.cache_mb) * (1 << 20));
}

#ifdef EPD_HAVE_TORCH_TOWER
ModelOptions MakeModelOptions(const WorkerFlags& f) {
  ModelOptions t;
  t.path = f.model;
  t.num_threads = f.threads;
  t.device = f.device;
  t.output_dtype = f.dtype == "bfloat16" ? DType::kBFloat16 : DType::kFloat32;
  // The executable owns the process's malloc tuning (TuneMalloc, cli_util.h).
  t.tune_malloc = false;
#ifdef EPD_HAVE_CUDA_TIER
  t.output_on_device = f.device != "cpu";  // the GPU tier
#endif
  return t;
}

// Model id and preprocessing: a checkpoint's own, a TorchScript file's name
// and the Qwen2-VL defaults; flags override either.
void ApplyLoadedModel(const WorkerFlags& f, const LoadedModel& loaded, WorkerOptions& o) {
  if (!f.model_id.empty()) {
    o.model_id = f.model_id;
  } else if (!loaded.model_id.empty()) {
    o.model_id = loaded.model_id;
  } else {
    o.model_id = std::filesystem::path(f.model).filename().string();
  }
  if (loaded.preprocess) o.preprocess = *loaded.preprocess;
  if (f.max_pixels > 0) {
    o.preprocess.max_pixels = f.max_pixels;
    o.preprocess.min_pixels = std::min(o.preprocess.min_pixels, f.max_pixels);
  }
}

// Caches, decoding, batches, their order and L3. Errors: a bad
// --rgba-background, or ApplyL3Flags'.
Status ApplyServingFlags(const WorkerFlags& f, WorkerOptions& o) {
  o.l1_capacity_bytes = CacheBytes(f, /*host=*/false);
  o.l2_capacity_bytes = CacheBytes(f, /*host=*/true);
  StatusOr<AlphaPolicy> alpha = ParseAlphaPolicy(f.rgba_background);
  if (!alpha.ok()) return alpha.status();
  o.preprocess.decode.alpha = *alpha;
  o.preprocess.decode.apply_exif_orientation = f.exif_orientation != "off";
  o.limits.max_pixels = f.max_decode_pixels;
  o.dedup_in_flight = !f.no_cache;
  o.max_tokens_per_batch = f.max_tokens_per_batch;
  o.max_items_per_batch = f.max_items_per_batch;
  o.decode_threads = f.decode_threads;
  o.max_video_decodes_per_tenant = f.max_video_decodes_per_tenant;
  // Both were checked by the flags' IsMember.
  o.eviction = *ParseEvictionPolicy(f.eviction);
  o.l1_admission = *ParseL1Admission(f.l1_admission);
  o.l1_admission_window = static_cast<std::uint64_t>(f.l1_admission_window);
  o.order = f.order == "by_key" ? ScheduleOrder::kByKey
            : f.order == "fair" ? ScheduleOrder::kFair
                                : ScheduleOrder::kFifo;
  return ApplyL3Flags(f.l3, o);
}

// Videos' sampling (for the model's patch size, so after ApplyLoadedModel)
// and limits.
void ApplyVideoFlags(const WorkerFlags& f, WorkerOptions& o) {
  o.video_sampling = VideoSampling::ForPatchSize(o.preprocess.patch_size);
  o.video_sampling.fps = f.video_fps;
  o.video_sampling.max_frames = f.video_max_frames;
  o.video_sampling.min_frames = std::min(o.video_sampling.min_frames, f.video_max_frames);
  o.video_sampling.apply_rotation = f.video_rotation != "off";
  o.video_limits.max_duration_s = f.video_max_seconds;
  o.video_limits.max_decode_frames = f.video_max_decode_frames;
  o.video_limits.max_decode_pixels = f.video_max_decode_pixels;
  o.video_limits.max_decode_seconds = f.video_max_decode_seconds;
  o.video_chunk_cache = !f.no_video_chunk_cache;
#ifdef EPD_HAVE_VIDEO
  o.decode_video = DecodeVideo;
  o.probe_video = [](std::span<const std::uint8_t> bytes, const VideoSampling& s, const PreprocessConfig& cfg,
                     const VideoLimits& limits) -> StatusOr<GridTHW> {
    StatusOr<VideoInfo> info = ProbeVideo(bytes, limits);
    if (!info.ok()) return info.status();
    return VideoHeaderGrid(*info, s, cfg);
  };
#endif
}
#endif  // EPD_HAVE_TORCH_TOWER

#ifdef EPD_HAVE_CUDA_TIER
// --device cuda: the process's GPU tier, sized for L1 and L2, and the hooks
// that move rows between it and the host.
StatusOr<Device*> AttachGpuTier(const WorkerFlags& f, WorkerOptions& o) {
  StatusOr<Device*> dev = ProcessCudaDevice(CudaIndex(f.device), static_cast<std::size_t>(o.l1_capacity_bytes),
                                            static_cast<std::size_t>(o.l2_capacity_bytes));
  if (!dev.ok()) return dev.status();
  EmbeddingTierHooks hooks = MakeEmbeddingTierHooks(**dev);
  o.to_host = std::move(hooks.to_host);
  o.to_device = std::move(hooks.to_device);
  o.adopt_device_rows = std::move(hooks.adopt_device_rows);
  return dev;
}
#endif

}  // namespace

StatusOr<WorkerParts> MakeWorkerParts(const WorkerFlags& f, WorkerOptions o) {
  if (Status s = CheckCacheSizes(f); !s.ok()) return s;
  // The reservations against the capacities, before the tower loads.
  StatusOr<std::shared_ptr<TenantQuotas>> quotas =
      MakeTenantQuotas(f.quotas, CacheBytes(f, /*host=*/false), CacheBytes(f, /*host=*/true));
  if (!quotas.ok()) return quotas.status();
#ifdef EPD_HAVE_TORCH_TOWER
  if (f.model.empty()) return InvalidArgument("--model is required (this build has no default tower)");
  StatusOr<LoadedModel> loaded = LoadModel(MakeModelOptions(f));
  if (!loaded.ok()) return loaded.status();
  ApplyLoadedModel(f, *loaded, o);
  o.tenant_quotas = std::move(*quotas);
  if (Status s = ApplyServingFlags(f, o); !s.ok()) return s;
  ApplyVideoFlags(f, o);
#ifdef EPD_HAVE_CUDA_TIER
  if (f.device != "cpu") {
    StatusOr<Device*> dev = AttachGpuTier(f, o);
    if (!dev.ok()) return dev.status();
    return WorkerParts{std::move(o), std::move(loaded->tower), *dev};
  }
#endif
  return WorkerParts{std::move(o), std::move(loaded->tower)};
#else
  (void)f;
  (void)o;
  (void)quotas;
  return FailedPrecondition("this epd-encode was built without the TorchScript tower (EPD_WITH_TORCH=OFF)");
#endif
}

StatusOr<std::unique_ptr<EncodeWorker>> MakeWorker(const WorkerFlags& f, WorkerOptions o) {
  StatusOr<WorkerParts> parts = MakeWorkerParts(f, std::move(o));
  if (!parts.ok()) return parts.status();
  return EncodeWorker::Create(std::move(parts->options), std::move(parts->tower));
}

}  // namespace epd::cli
