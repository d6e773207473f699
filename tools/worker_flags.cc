#include "worker_flags.h"

#include "flag_checks.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "epd/embedding_cache.h"

#ifdef EPD_HAVE_TORCH_TOWER
#include "epd/torch_tower.h"
#endif
#ifdef EPD_HAVE_CUDA_TIER
#include <cstdlib>
#include <mutex>

#include "epd/cuda_device.h"
#include "epd/device_tier.h"
#endif

namespace epd::cli {

std::string DefaultModelPath() {
#ifdef EPD_DEFAULT_TOWER_PATH
  return EPD_DEFAULT_TOWER_PATH;
#else
  return "";
#endif
}

void AddWorkerFlags(CLI::App& cmd, WorkerFlags& f) {
  f.model = DefaultModelPath();
  cmd.add_option("--model", f.model, "TorchScript vision tower (docs/TOWER.md contract)")
      ->capture_default_str();
  cmd.add_option("--model-id", f.model_id, "model id hashed into the content keys [file name of --model]");
  cmd.add_option("--threads", f.threads, "tower intra-op threads, 0 = all cores")->capture_default_str()
      ->check(Integer(0, 1024));
  cmd.add_option("--device", f.device, "where the tower runs: cpu, cuda or cuda:N (with a CUDA build, L1 in VRAM)")
      ->capture_default_str();
  cmd.add_option("--dtype", f.dtype, "embedding dtype")->capture_default_str()
      ->check(CLI::IsMember({"float32", "bfloat16"}));
  cmd.add_option("--cache-mb", f.cache_mb, "L1 cache capacity, MB")->capture_default_str()
      ->check(NonNegative("MB"));
  cmd.add_option("--host-cache-mb", f.host_cache_mb, "L2 (host) cache capacity, MB")->capture_default_str()
      ->check(NonNegative("MB"));
  cmd.add_flag("--no-cache", f.no_cache, "turn caching and in-flight deduplication off (baseline runs)");
  cmd.add_option("--max-tokens-per-batch", f.max_tokens_per_batch, "tower batch token budget")
      ->capture_default_str()->check(Integer(1));
  cmd.add_option("--max-items-per-batch", f.max_items_per_batch, "tower batch item bound")
      ->capture_default_str()->check(Integer(1));
  cmd.add_option("--order", f.order, "scheduler order")->capture_default_str()
      ->check(CLI::IsMember({"fifo", "by_key"}));
  cmd.add_option("--max-pixels", f.max_pixels, "preprocessing area cap, pixels (Qwen2-VL max_pixels)")
      ->capture_default_str()->check(Integer(1));
  cmd.add_option("--decode-threads", f.decode_threads, "helper threads decoding misses ahead of the tower")
      ->capture_default_str()->check(Integer(0, 256));
}

#ifdef EPD_HAVE_CUDA_TIER
namespace {

// The process's CUDA device for the GPU tier, opened on first use and never
// closed: every worker, cached entry and delivered result must be destroyed
// before their Device, and for a command-line process the only point after
// all of them is its exit. Thread-safe; later calls return the first device
// (a process uses one GPU).
StatusOr<Device*> ProcessCudaDevice(int index, std::size_t pinned_bytes, std::size_t device_limit) {
  static std::mutex mu;
  static Device* device = nullptr;
  std::lock_guard<std::mutex> lock(mu);
  if (device != nullptr) return device;
  CudaDeviceOptions opt;
  opt.device_index = index;
  opt.pinned_pool_bytes = pinned_bytes;
  opt.device_bytes_limit = device_limit;
  StatusOr<std::unique_ptr<Device>> opened = OpenCudaDevice(opt);
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

StatusOr<WorkerParts> MakeWorkerParts(const WorkerFlags& f, WorkerOptions o) {
  // At most what the cache's byte counter holds (epd::kMaxCacheBytes), checked
  // before the conversion to bytes below, which would overflow.
  for (const auto& [flag, mb] : {std::pair{"--cache-mb", f.cache_mb}, std::pair{"--host-cache-mb", f.host_cache_mb}}) {
    if (mb > static_cast<double>(kMaxCacheBytes >> 20)) {
      char got[32];
      std::snprintf(got, sizeof(got), "%g", mb);
      return InvalidArgument(std::string(flag) + ": at most " + std::to_string(kMaxCacheBytes >> 20) +
                             " MB (what the cache's byte counter holds), got " + got);
    }
  }
#ifdef EPD_HAVE_TORCH_TOWER
  if (f.model.empty()) return InvalidArgument("--model is required (this build has no default tower)");
  TorchTowerOptions t;
  t.model_path = f.model;
  t.num_threads = f.threads;
  t.device = f.device;
  t.output_dtype = f.dtype == "bfloat16" ? DType::kBFloat16 : DType::kFloat32;
#ifdef EPD_HAVE_CUDA_TIER
  const bool gpu_tier = f.device != "cpu";
  t.output_on_device = gpu_tier;
#endif
  StatusOr<std::unique_ptr<VisionTower>> tower = LoadTorchScriptTower(t);
  if (!tower.ok()) return tower.status();

  o.model_id = f.model_id.empty() ? std::filesystem::path(f.model).filename().string() : f.model_id;
  o.preprocess.max_pixels = f.max_pixels;
  o.preprocess.min_pixels = std::min(o.preprocess.min_pixels, f.max_pixels);
  o.l1_bytes = f.no_cache ? 0 : static_cast<std::int64_t>(f.cache_mb * (1 << 20));
  o.l2_bytes = f.no_cache ? 0 : static_cast<std::int64_t>(f.host_cache_mb * (1 << 20));
  o.dedup_in_flight = !f.no_cache;
  o.max_tokens_per_batch = f.max_tokens_per_batch;
  o.max_items_per_batch = f.max_items_per_batch;
  o.decode_threads = f.decode_threads;
  o.order = f.order == "by_key" ? ScheduleOrder::kByKey : ScheduleOrder::kFifo;
#ifdef EPD_HAVE_CUDA_TIER
  if (gpu_tier) {
    // Pinned pool: L2 plus slack for the blocks a demotion allocates before
    // L2 evicts (docs/GPU.md, "Sizing the pool"). VRAM cap: L1 plus room for
    // the copies in flight, so the tier never takes the tower's activations.
    const auto l1 = static_cast<std::size_t>(o.l1_bytes);
    const auto l2 = static_cast<std::size_t>(o.l2_bytes);
    StatusOr<Device*> dev = ProcessCudaDevice(CudaIndex(f.device), l2 + std::max(l2 / 16, std::size_t{64} << 20),
                                              l1 + std::max(l1 / 4, std::size_t{256} << 20));
    if (!dev.ok()) return dev.status();
    EmbeddingTierHooks hooks = MakeEmbeddingTierHooks(**dev);
    o.to_host = std::move(hooks.to_host);
    o.to_device = std::move(hooks.to_device);
    o.adopt_device_rows = std::move(hooks.adopt_device_rows);
  }
#endif
  return WorkerParts{std::move(o), std::move(*tower)};
#else
  (void)f;
  (void)o;
  return FailedPrecondition("this epd-encode was built without the TorchScript tower (EPD_WITH_TORCH=OFF)");
#endif
}

StatusOr<std::unique_ptr<EncodeWorker>> MakeWorker(const WorkerFlags& f, WorkerOptions o) {
  StatusOr<WorkerParts> parts = MakeWorkerParts(f, std::move(o));
  if (!parts.ok()) return parts.status();
  return EncodeWorker::Create(std::move(parts->options), std::move(parts->tower));
}

}  // namespace epd::cli
