// Offload (D2H) and onboard (H2D) throughput through the GPU tier, against
// the plain pinned cudaMemcpy peak measured in the same run.
//
// For each entry size S it moves --total-mb of entries (N = total / S):
//   peak      one cudaMemcpyAsync of the whole total between a cudaHostAlloc
//             buffer and a cudaMalloc buffer on a non-blocking stream (the
//             ceiling), and the same total as N back-to-back S-byte copies;
//   offload   OffloadEmbedding on N device entries, then Wait() on each: pool
//             allocation, event record and the release list included;
//   onboard   OnboardEmbedding on the N pinned entries, then Wait();
//   churn     a TieredEmbeddingCache with L1 = N/2 and L2 = N entries, read
//             in key order so every get promotes one entry and demotes
//             another: both streams busy at once (bytes moved both ways / s).
// Each figure is the best of --reps runs, timed on the host (steady_clock)
// from the first enqueue to the last completion. GB/s is 1e9 bytes/s.
//
//   gpu_tier_bench [--total-mb 1024] [--sizes 262144,1638400,8388608] [--reps 5] [--json out.json]
// Exits 2 without a CUDA device, 1 if a copy comes back with wrong bytes.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "epd/core/tiered_cache.h"
#include "epd/gpu/device_tier.h"
#include "epd/gpu_cuda/cuda_device.h"
#include "epd/media/content_key.h"

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "gpu_tier_bench: %s\n", what.c_str());
  std::exit(1);
}

void Check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) Die(std::string(what) + ": " + cudaGetErrorString(err));
}

template <typename T>
T Unwrap(epd::StatusOr<T> v, const char* what) {
  if (!v.ok()) Die(std::string(what) + ": " + v.status().ToString());
  return std::move(v).value();
}

struct Peak {
  double h2d_gbs = 0, d2h_gbs = 0;                  // one copy of the whole total
  double h2d_chunked_gbs = 0, d2h_chunked_gbs = 0;  // N copies of S bytes
};

// Plain pinned copies: the ceiling the tier is measured against.
Peak MeasurePeak(std::size_t total, std::size_t chunk, int reps) {
  void* host = nullptr;
  void* dev = nullptr;
  cudaStream_t s = nullptr;
  Check(cudaHostAlloc(&host, total, cudaHostAllocDefault), "cudaHostAlloc");
  Check(cudaMalloc(&dev, total), "cudaMalloc");
  Check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  std::memset(host, 0x3c, total);
  auto run = [&](bool h2d, std::size_t piece) {
    double best = 0;
    for (int r = 0; r < reps + 1; ++r) {  // the first run warms up
      const Clock::time_point t0 = Clock::now();
      for (std::size_t off = 0; off + piece <= total; off += piece) {
        char* d = static_cast<char*>(dev) + off;
        char* h = static_cast<char*>(host) + off;
        Check(h2d ? cudaMemcpyAsync(d, h, piece, cudaMemcpyHostToDevice, s)
                  : cudaMemcpyAsync(h, d, piece, cudaMemcpyDeviceToHost, s),
              "cudaMemcpyAsync");
      }
      Check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
      const double gbs = static_cast<double>(total / piece * piece) / Seconds(t0, Clock::now()) / 1e9;
      if (r > 0) best = std::max(best, gbs);
    }
    return best;
  };
  Peak p;
  p.h2d_gbs = run(true, total);
  p.d2h_gbs = run(false, total);
  p.h2d_chunked_gbs = run(true, chunk);
  p.d2h_chunked_gbs = run(false, chunk);
  cudaStreamDestroy(s);
  cudaFree(dev);
  cudaFreeHost(host);
  return p;
}

struct TierResult {
  double offload_gbs = 0, onboard_gbs = 0, churn_gbs = 0;
};

epd::ContentKey Key(std::size_t i) {
  epd::ContentKey k;
  std::memcpy(k.bytes.data(), &i, sizeof(i));
  k.bytes[31] = 1;
  return k;
}

TierResult MeasureTier(epd::Device& dev, std::size_t entry_bytes, std::size_t n, int reps) {
  // hidden 2048 bf16 = 4096 bytes per token, no deepstack: entry_bytes / 4096 tokens.
  auto emb = std::make_shared<epd::Embedding>();
  emb->hidden = 2048;
  emb->dtype = epd::DType::kBFloat16;
  emb->tokens = static_cast<std::int64_t>(entry_bytes / 4096);
  emb->main.resize(static_cast<std::size_t>(emb->tokens) * 4096);
  for (std::size_t i = 0; i < emb->main.size(); ++i) emb->main[i] = static_cast<std::byte>(i * 7 + 1);
  const std::size_t bytes = emb->nbytes();
  TierResult best;

  std::vector<epd::TierEmbeddingPtr> l1, l2;
  for (std::size_t i = 0; i < n; ++i) l1.push_back(Unwrap(epd::UploadEmbedding(dev, emb), "upload"));
  for (auto& v : l1) {
    if (!v->Wait().ok()) Die("upload failed");
  }
  for (int r = 0; r < reps + 1; ++r) {
    Clock::time_point t0 = Clock::now();
    l2.clear();
    for (auto& v : l1) l2.push_back(Unwrap(epd::OffloadEmbedding(dev, v), "offload"));
    for (auto& v : l2) {
      if (!v->Wait().ok()) Die("offload failed");
    }
    const double off = static_cast<double>(n * bytes) / Seconds(t0, Clock::now()) / 1e9;
    l1.clear();  // VRAM goes back through the release list
    t0 = Clock::now();
    for (auto& v : l2) l1.push_back(Unwrap(epd::OnboardEmbedding(dev, v), "onboard"));
    for (auto& v : l1) {
      if (!v->Wait().ok()) Die("onboard failed");
    }
    const double on = static_cast<double>(n * bytes) / Seconds(t0, Clock::now()) / 1e9;
    if (r > 0) {
      best.offload_gbs = std::max(best.offload_gbs, off);
      best.onboard_gbs = std::max(best.onboard_gbs, on);
    }
  }
  // Byte check on one entry that went down and up (reps + 1) times.
  epd::Embedding back = Unwrap(l1[n / 2]->ToHostEmbedding(), "ship");
  if (back.main != emb->main) Die("entry " + std::to_string(n / 2) + " came back with different bytes");
  l1.clear();
  l2.clear();
  (void)dev.Synchronize(epd::Stream::kOnboard);
  (void)dev.Synchronize(epd::Stream::kOffload);
  dev.Poll();

  // Churn through the cache: every get is an L2 hit (keys read in order,
  // L1 holds the most recent half).
  const auto nb = static_cast<std::int64_t>(bytes);
  epd::DeviceTierStats stats;
  epd::TieredEmbeddingCache<epd::ContentKey, epd::TierEmbeddingPtr, epd::ContentKeyHash> cache(
      nb * static_cast<std::int64_t>(n / 2), nb * static_cast<std::int64_t>(n), epd::MakeOffloadFn(dev, &stats),
      epd::MakeOnboardFn(dev, &stats));
  for (std::size_t i = 0; i < n; ++i) cache.Put(Key(i), Unwrap(epd::UploadEmbedding(dev, emb), "upload"), nb);
  (void)dev.Synchronize(epd::Stream::kOnboard);
  (void)dev.Synchronize(epd::Stream::kOffload);
  for (int r = 0; r < reps + 1; ++r) {
    const std::uint64_t moved0 = stats.offload_bytes + stats.onboard_bytes;
    const Clock::time_point t0 = Clock::now();
    for (std::size_t i = 0; i < n; ++i) {
      if (!cache.Get(Key(i)).has_value()) Die("churn: key " + std::to_string(i) + " missing");
    }
    if (!dev.Synchronize(epd::Stream::kOnboard).ok() || !dev.Synchronize(epd::Stream::kOffload).ok()) {
      Die("churn: a copy failed");
    }
    const double gbs =
        static_cast<double>(stats.offload_bytes + stats.onboard_bytes - moved0) / Seconds(t0, Clock::now()) / 1e9;
    if (r > 0) best.churn_gbs = std::max(best.churn_gbs, gbs);
  }
  if (stats.offload_dropped != 0 || stats.onboard_fallbacks != 0) {
    std::fprintf(stderr, "gpu_tier_bench: churn dropped %llu demotions, %llu onboard fallbacks\n",
                 static_cast<unsigned long long>(stats.offload_dropped),
                 static_cast<unsigned long long>(stats.onboard_fallbacks));
  }
  return best;
}

std::vector<std::size_t> ParseSizes(const std::string& s) {
  std::vector<std::size_t> out;
  std::size_t pos = 0;
  while (pos < s.size()) {
    const std::size_t comma = s.find(',', pos);
    const std::string item = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    const unsigned long long v = std::strtoull(item.c_str(), nullptr, 10);
    if (v < 4096) Die("--sizes: entry size '" + item + "' must be >= 4096 bytes");
    out.push_back(static_cast<std::size_t>(v) / 4096 * 4096);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t total_mb = 1024;
  std::vector<std::size_t> sizes = {std::size_t{256} << 10, 1638400, std::size_t{8} << 20};
  int reps = 5;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) Die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--total-mb") {
      total_mb = std::strtoull(next().c_str(), nullptr, 10);
    } else if (a == "--sizes") {
      sizes = ParseSizes(next());
    } else if (a == "--reps") {
      reps = std::max(1, std::atoi(next().c_str()));
    } else if (a == "--json") {
      json_path = next();
    } else {
      Die("unknown argument '" + a + "' (see the comment at the top of gpu_tier_bench.cc)");
    }
  }
  if (total_mb == 0) Die("--total-mb must be > 0");
  epd::StatusOr<int> count = epd::CudaDeviceCount();
  if (!count.ok() || *count == 0) {
    std::fprintf(stderr, "gpu_tier_bench: no CUDA device (%s)\n",
                 count.ok() ? "count 0" : count.status().ToString().c_str());
    return 2;
  }
  const std::size_t total = total_mb << 20;
  const std::size_t max_entry = *std::max_element(sizes.begin(), sizes.end());
  epd::CudaDeviceOptions opt;
  // L2 holds the whole working set; headroom of two entries for the churn's
  // promote-then-demote (see docs/GPU.md) and the pool's rounding.
  opt.pinned_pool_bytes = total + 2 * max_entry + (std::size_t{4} << 20);
  auto dev = Unwrap(epd::OpenCudaDevice(opt), "OpenCudaDevice");
  std::printf("device: %s\n", dev->Describe().c_str());
  std::printf("total per run: %zu MiB, best of %d runs\n\n", total_mb, reps);
  std::printf(
      "| entry bytes | entries | offload GB/s | onboard GB/s | churn GB/s (both ways) | pinned peak D2H | "
      "pinned peak H2D | peak D2H at entry size | peak H2D at entry size | offload / peak | "
      "onboard / peak |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::string json = "{\n  \"device\": \"" + dev->Describe() + "\",\n  \"total_mb\": " + std::to_string(total_mb) +
                     ",\n  \"results\": [";
  for (std::size_t s : sizes) {
    const std::size_t n = std::max<std::size_t>(2, total / s);
    const Peak peak = MeasurePeak(n * s, s, reps);
    const TierResult t = MeasureTier(*dev, s, n, reps);
    const double off_ratio = t.offload_gbs / peak.d2h_gbs;
    const double on_ratio = t.onboard_gbs / peak.h2d_gbs;
    std::printf("| %zu | %zu | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.0f%% | %.0f%% |\n", s, n,
                t.offload_gbs, t.onboard_gbs, t.churn_gbs, peak.d2h_gbs, peak.h2d_gbs, peak.d2h_chunked_gbs,
                peak.h2d_chunked_gbs, 100 * off_ratio, 100 * on_ratio);
    std::fflush(stdout);
    char buf[512];
    std::snprintf(buf, sizeof(buf),
                  "%s\n    {\"entry_bytes\": %zu, \"entries\": %zu, \"offload_gbs\": %.3f, \"onboard_gbs\": %.3f, "
                  "\"churn_gbs\": %.3f, \"peak_d2h_gbs\": %.3f, \"peak_h2d_gbs\": %.3f, "
                  "\"peak_d2h_chunked_gbs\": %.3f, \"peak_h2d_chunked_gbs\": %.3f}",
                  s == sizes.front() ? "" : ",", s, n, t.offload_gbs, t.onboard_gbs, t.churn_gbs, peak.d2h_gbs,
                  peak.h2d_gbs, peak.d2h_chunked_gbs, peak.h2d_chunked_gbs);
    json += buf;
  }
  json += "\n  ]\n}\n";
  if (!json_path.empty()) {
    std::FILE* f = std::fopen(json_path.c_str(), "w");
    if (f == nullptr) Die("cannot write " + json_path);
    std::fputs(json.c_str(), f);
    std::fclose(f);
  }
  return 0;
}
