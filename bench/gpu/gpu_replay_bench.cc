// Replay on a GPU: the encode worker with the TorchScript tower on cuda:N,
// its output kept in VRAM, L1 in VRAM and L2 in pinned host memory (the GPU
// tier's hooks), against the tower-only limit measured in the same process.
//
//   gpu_replay_bench --model tower.pt --images DIR [--device-index 0]
//                    [--requests 600] [--zipf 1.0] [--seed 1]
//                    [--l1-mb 64] [--l2-mb 512] [--decode-threads 8]
//                    [--max-tokens 8192] [--max-items 16]
//                    [--window 8] [--runs replay,no_cache,replay_ship]
//                    [--dtype float32|bfloat16] [--json FILE]
//
// Trace: `--requests` single-image requests; request i shows image k of the
// directory's files (sorted by name) with probability proportional to
// 1 / (k+1)^zipf, drawn with std::mt19937_64(seed), so every run of the same
// arguments replays the same sequence.
//
// Four runs, each through a fresh WorkerLoop over the same loaded tower and
// the same CUDA device, after one untimed warm-up run of the limit's work.
// Requests arrive in a closed loop: at most --window outstanding, as that
// many clients each waiting for its answer (0: all submitted at once, as
// `epd-encode replay` does, where repeats mostly join in flight instead of
// hitting the cache). Items are delivered as the worker delivers them, in
// VRAM (or pinned memory), as a prefill engine on the device would take them:
//   limit        each distinct image of the trace once. Its tower_s (wall
//                time inside VisionTower::Encode) is the tower-only limit: no
//                replay of the trace can do less tower work.
//   replay       the trace with the tiers on.
//   no_cache     the trace with both tiers at 0 bytes (in-flight joins on).
//   replay_ship  the trace again, every delivered embedding also copied to
//                host memory (ToHost) on the collecting thread, as the gRPC
//                server does before sending. Every repeat delivery of a key
//                must ship exactly the bytes its first delivery shipped (a
//                failure otherwise): the demote/promote round trip through
//                pinned memory is byte-exact.
// Reported per run: wall seconds (first Submit to last delivered item),
// tower seconds and calls, hits by tier, and the tier's copies (adopts,
// offloads, onboards); `vs limit` = wall / limit tower_s.
//
// Exits 2 when no CUDA device or tower can be opened, 1 on bad arguments or
// when an item fails.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "epd/gpu/device_tier.h"
#include "epd/gpu_cuda/cuda_device.h"
#include "epd/torch_tower/torch_tower.h"
#include "epd/worker/encode_worker.h"
#include "epd/worker/worker_loop.h"

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const std::string& what, int code = 1) {
  std::fprintf(stderr, "gpu_replay_bench: %s\n", what.c_str());
  std::exit(code);
}

// A VisionTower that forwards to one the bench owns, so the three runs share
// one loaded (and warmed-up) tower.
class BorrowedTower final : public epd::VisionTower {
 public:
  explicit BorrowedTower(epd::VisionTower& t) : t_(t) {}
  epd::StatusOr<epd::TowerOutput> Encode(std::span<const epd::TowerItem> items) override { return t_.Encode(items); }
  std::int64_t patch_dim() const override { return t_.patch_dim(); }
  std::int64_t merge_size() const override { return t_.merge_size(); }
  std::int64_t hidden() const override { return t_.hidden(); }
  std::int64_t deepstack_layers() const override { return t_.deepstack_layers(); }
  epd::DType dtype() const override { return t_.dtype(); }
  bool output_on_device() const override { return t_.output_on_device(); }
  std::string Describe() const override { return t_.Describe(); }

 private:
  epd::VisionTower& t_;
};

struct Args {
  std::string model;
  std::string images;
  int device_index = 0;
  int requests = 600;
  double zipf = 1.0;
  std::uint64_t seed = 1;
  std::int64_t l1_mb = 64;
  std::int64_t l2_mb = 512;
  int decode_threads = 8;
  std::int64_t max_tokens = 8192;
  std::int64_t max_items = 16;
  int window = 8;
  std::string runs = "replay,no_cache,replay_ship";  // besides the limit, which always runs
  epd::DType dtype = epd::DType::kFloat32;
  std::string json;
};

struct RunResult {
  std::string name;
  double wall_s = 0;
  epd::WorkerStats stats;
  epd::DeviceTierStats tier;
  std::int64_t items = 0;
  std::int64_t failed = 0;
  std::int64_t mismatches = 0;  // repeat deliveries whose bytes differed from the first
  std::string first_failure;
};

std::vector<std::size_t> ZipfTrace(std::size_t n_images, int requests, double s, std::uint64_t seed) {
  std::vector<double> cdf(n_images);
  double total = 0;
  for (std::size_t k = 0; k < n_images; ++k) cdf[k] = total += 1.0 / std::pow(static_cast<double>(k + 1), s);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, total);
  std::vector<std::size_t> trace;
  for (int i = 0; i < requests; ++i) {
    trace.push_back(static_cast<std::size_t>(std::upper_bound(cdf.begin(), cdf.end(), u(rng)) - cdf.begin()));
    trace.back() = std::min(trace.back(), n_images - 1);
  }
  return trace;
}

RunResult Run(const std::string& name, const Args& a, epd::Device& device, epd::VisionTower& tower,
              const std::vector<std::string>& media, const std::vector<std::size_t>& order, bool cache, bool ship) {
  RunResult r;
  r.name = name;
  epd::EmbeddingTierHooks hooks = epd::MakeEmbeddingTierHooks(device, &r.tier);
  epd::WorkerOptions o;
  o.model_id = "gpu-replay";
  o.l1_capacity_bytes = cache ? a.l1_mb << 20 : 0;
  o.l2_capacity_bytes = cache ? a.l2_mb << 20 : 0;
  o.to_host = hooks.to_host;
  o.to_device = hooks.to_device;
  o.adopt_device_rows = hooks.adopt_device_rows;
  o.decode_threads = a.decode_threads;
  o.max_tokens_per_batch = a.max_tokens;
  o.max_items_per_batch = a.max_items;
  auto worker = epd::EncodeWorker::Create(std::move(o), std::make_unique<BorrowedTower>(tower));
  if (!worker.ok()) Die("worker: " + worker.status().ToString());
  {
    epd::WorkerLoop loop(std::move(*worker));
    std::vector<std::future<epd::RequestResult>> futures;
    futures.reserve(order.size());
    // Bytes shipped for each key the first time; every later delivery of the
    // key (a hit, demoted and promoted in between, or a join) must ship the
    // same bytes. Only with the cache on: a recomputation in another batch
    // may round differently.
    std::map<epd::ContentKey, epd::EmbeddingPtr> shipped;
    auto collect = [&](std::future<epd::RequestResult>& f) {
      epd::RequestResult res = f.get();
      for (const epd::ItemResult& it : res.items) {
        ++r.items;
        epd::Status st = it.status;
        if (st.ok() && ship) {
          epd::StatusOr<epd::EmbeddingPtr> host = epd::ToHost(it.embedding);  // ship
          if (!host.ok()) {
            st = host.status();
          } else if (cache) {
            auto [first, inserted] = shipped.emplace(it.key, *host);
            if (!inserted && (first->second->main != (*host)->main || first->second->deepstack != (*host)->deepstack)) {
              ++r.mismatches;
              st = epd::Internal("key " + it.key.Hex() + " shipped different bytes on its " +
                                 std::string(epd::ItemSourceName(it.source)) + " delivery");
            }
          }
        }
        if (!st.ok()) {
          if (r.failed++ == 0) r.first_failure = st.ToString();
        }
      }
      if (!res.status.ok() && r.failed++ == 0) r.first_failure = res.status.ToString();
    };
    const Clock::time_point start = Clock::now();
    std::size_t collected = 0;
    for (std::size_t i = 0; i < order.size(); ++i) {
      // Closed loop: at most `window` requests outstanding, as that many
      // clients each waiting for its answer before sending the next.
      if (a.window > 0 && i >= static_cast<std::size_t>(a.window)) collect(futures[collected++]);
      epd::EncodeRequest req{name + "-" + std::to_string(i), {}};
      epd::EncodeItemInput in;
      in.media = media[order[i]];
      req.items.push_back(std::move(in));
      futures.push_back(loop.Submit(std::move(req)));
    }
    while (collected < futures.size()) collect(futures[collected++]);
    r.wall_s = std::chrono::duration<double>(Clock::now() - start).count();
    loop.Shutdown(std::chrono::milliseconds(0));
    r.stats = loop.Stats();
  }
  // The worker (and its cache) are gone: let the deferred frees run.
  while (device.Poll() != 0) {
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) Die(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--model")
      a.model = next();
    else if (arg == "--images")
      a.images = next();
    else if (arg == "--device-index")
      a.device_index = std::atoi(next().c_str());
    else if (arg == "--requests")
      a.requests = std::atoi(next().c_str());
    else if (arg == "--zipf")
      a.zipf = std::atof(next().c_str());
    else if (arg == "--seed")
      a.seed = std::strtoull(next().c_str(), nullptr, 10);
    else if (arg == "--l1-mb")
      a.l1_mb = std::atoll(next().c_str());
    else if (arg == "--l2-mb")
      a.l2_mb = std::atoll(next().c_str());
    else if (arg == "--decode-threads")
      a.decode_threads = std::atoi(next().c_str());
    else if (arg == "--max-tokens")
      a.max_tokens = std::atoll(next().c_str());
    else if (arg == "--max-items")
      a.max_items = std::atoll(next().c_str());
    else if (arg == "--json")
      a.json = next();
    else if (arg == "--window")
      a.window = std::atoi(next().c_str());
    else if (arg == "--runs")
      a.runs = next();
    else if (arg == "--dtype") {
      const std::string d = next();
      if (d == "bfloat16")
        a.dtype = epd::DType::kBFloat16;
      else if (d != "float32")
        Die("--dtype must be float32 or bfloat16, got '" + d + "'");
    } else {
      Die("unknown argument '" + arg + "'");
    }
  }
  if (a.model.empty() || a.images.empty()) Die("--model and --images are required");
  if (a.requests < 1 || a.l1_mb < 0 || a.l2_mb < 0 || a.decode_threads < 0 || a.window < 0) {
    Die("--requests must be >= 1 and --l1-mb, --l2-mb, --decode-threads, --window >= 0");
  }

  // Images, read before any clock starts.
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(a.images, ec)) {
    const std::string ext = e.path().extension().string();
    if (ext == ".jpg" || ext == ".jpeg" || ext == ".png") files.push_back(e.path());
  }
  if (ec || files.empty()) Die("no .jpg/.jpeg/.png files in '" + a.images + "'");
  std::sort(files.begin(), files.end());
  std::vector<std::string> media;
  for (const auto& p : files) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    media.push_back(ss.str());
  }

  // Sized as `epd-encode --device cuda` sizes it (SizeGpuTier).
  auto device = epd::OpenGpuTier(a.device_index, static_cast<std::size_t>(a.l1_mb) << 20,
                                 static_cast<std::size_t>(a.l2_mb) << 20);
  if (!device.ok()) Die("CUDA device: " + device.status().ToString(), 2);

  epd::TorchTowerOptions topt;
  topt.model_path = a.model;
  topt.device = "cuda:" + std::to_string(a.device_index);
  topt.output_on_device = true;
  topt.output_dtype = a.dtype;
  topt.num_threads = 4;
  auto tower = epd::LoadTorchScriptTower(topt);
  if (!tower.ok()) Die("tower: " + tower.status().ToString(), 2);

  const std::vector<std::size_t> trace = ZipfTrace(media.size(), a.requests, a.zipf, a.seed);
  std::vector<std::size_t> distinct = trace;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());

  std::printf(
      "device: %s\ntower: %s\ntrace: %d requests over %zu images (%zu distinct in the trace), zipf %.2f, "
      "seed %llu, window %d; L1 %lld MiB (VRAM), L2 %lld MiB (pinned)\n\n",
      (*device)->Describe().c_str(), (*tower)->Describe().c_str(), a.requests, media.size(), distinct.size(), a.zipf,
      static_cast<unsigned long long>(a.seed), a.window, static_cast<long long>(a.l1_mb),
      static_cast<long long>(a.l2_mb));

  std::vector<RunResult> runs;
  // Untimed: the first forwards of each batch shape pay TorchScript's
  // profiling and the allocators' growth, which no later run pays.
  (void)Run("warm_up", a, **device, **tower, media, distinct, true, false);
  runs.push_back(Run("limit", a, **device, **tower, media, distinct, true, false));
  auto wanted = [&](const std::string& name) {
    return ("," + a.runs + ",").find("," + name + ",") != std::string::npos;
  };
  if (wanted("replay")) runs.push_back(Run("replay", a, **device, **tower, media, trace, true, false));
  if (wanted("no_cache")) runs.push_back(Run("no_cache", a, **device, **tower, media, trace, false, false));
  if (wanted("replay_ship")) runs.push_back(Run("replay_ship", a, **device, **tower, media, trace, true, true));

  const double limit = runs[0].stats.tower_seconds;
  std::printf(
      "| run | wall s | vs limit | tower s | tower calls | tower items | L1 hits | L2 hits | joins | "
      "adopts | offloads | onboards | offload drops | failed |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  bool any_failed = false;
  for (const RunResult& r : runs) {
    const epd::WorkerStats& s = r.stats;
    std::printf("| %s | %.3f | %.3fx | %.3f | %llu | %llu | %llu | %llu | %llu | %llu | %llu | %llu | %llu | %lld |\n",
                r.name.c_str(), r.wall_s, limit > 0 ? r.wall_s / limit : 0.0, s.tower_seconds,
                static_cast<unsigned long long>(s.tower_batches), static_cast<unsigned long long>(s.tower_items),
                static_cast<unsigned long long>(s.hits_l1), static_cast<unsigned long long>(s.hits_l2),
                static_cast<unsigned long long>(s.joins), static_cast<unsigned long long>(r.tier.adopts),
                static_cast<unsigned long long>(r.tier.offloads), static_cast<unsigned long long>(r.tier.onboards),
                static_cast<unsigned long long>(r.tier.offload_dropped), static_cast<long long>(r.failed));
    if (r.failed > 0) {
      any_failed = true;
      std::fprintf(stderr, "%s: %lld items failed, first: %s\n", r.name.c_str(), static_cast<long long>(r.failed),
                   r.first_failure.c_str());
    }
  }
  if (!a.json.empty()) {
    std::ofstream out(a.json);
    out << "{\"requests\": " << a.requests << ", \"images\": " << media.size() << ", \"distinct\": " << distinct.size()
        << ", \"zipf\": " << a.zipf << ", \"limit_tower_s\": " << limit << ", \"runs\": [";
    for (std::size_t i = 0; i < runs.size(); ++i) {
      const RunResult& r = runs[i];
      out << (i ? ", " : "") << "{\"name\": \"" << r.name << "\", \"wall_s\": " << r.wall_s
          << ", \"tower_s\": " << r.stats.tower_seconds << ", \"tower_calls\": " << r.stats.tower_batches
          << ", \"tower_items\": " << r.stats.tower_items << ", \"hits_l1\": " << r.stats.hits_l1
          << ", \"hits_l2\": " << r.stats.hits_l2 << ", \"joins\": " << r.stats.joins
          << ", \"adopts\": " << r.tier.adopts << ", \"offloads\": " << r.tier.offloads
          << ", \"onboards\": " << r.tier.onboards << ", \"failed\": " << r.failed << "}";
    }
    out << "]}\n";
  }
  return any_failed ? 1 : 0;
}
