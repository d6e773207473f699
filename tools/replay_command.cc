// `epd-encode replay`: runs a trace of requests through a WorkerLoop with a
// real tower and reports what the cache, the batcher and the tower did.
//
// The images are read into memory before the clock starts, so the figures
// measure the encode path (hash, decode, preprocess, schedule, tower, copy),
// not the disk. Requests are submitted from the main thread, which therefore
// also computes their content keys (WorkerLoop hashes on the caller's thread);
// the worker's helper and tower threads decode misses and run the tower.
// Latency is per request, from its Submit to its on_done; wall time runs from
// the first Submit to the last on_done. Percentiles use the nearest-rank method (the smallest value
// with at least q of the samples at or below it).
//
// Exit codes: 0 all items encoded; 1 usage or setup error (bad trace, missing
// image, tower load failure); 3 the replay ran but some items failed.
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "cli_util.h"
#include "commands.h"
#include "epd/plan/plan.h"
#include "epd/worker/safetensors.h"
#include "epd/worker/worker_loop.h"
#include "flag_checks.h"
#include "replay_manifest.h"
#include "trace.h"
#include "worker_flags.h"

namespace epd::cli {

using plan::PlanJson;
using plan::PlanOptions;
using plan::PlanResult;
using plan::PlanText;
using plan::RunPlan;
using plan::SizingRow;

namespace {

using Clock = std::chrono::steady_clock;

struct ReplayFlags {
  WorkerFlags worker;
  std::string trace;
  std::string images;
  std::int64_t generate = 0;
  double zipf = 1.0;
  std::uint64_t seed = 1;
  double rate = 100;
  std::string write_trace;
  bool realtime = false;
  bool as_fast_as_possible = false;
  bool json = false;
  bool mrc = false;
  std::string out;
  double max_request_mb = static_cast<double>(kDefaultMaxRequestBytes) / (1 << 20);  // each file read
};

// Redraws a one-line bar on stderr every 100 ms until Stop().
class ProgressBar {
 public:
  ProgressBar(const std::atomic<std::int64_t>& done, std::int64_t total) : done_(done), total_(total) {
    thread_ = std::thread([this] {
      while (!stop_.load()) {
        Draw();
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      Draw();
      std::fputc('\n', stderr);
    });
  }
  ~ProgressBar() { Stop(); }
  void Stop() {
    if (!thread_.joinable()) return;
    stop_ = true;
    thread_.join();
  }

 private:
  void Draw() const {
    constexpr int kWidth = 40;
    const std::int64_t d = done_.load();
    const int filled = total_ == 0 ? kWidth : static_cast<int>(kWidth * d / total_);
    std::fprintf(stderr, "\rreplay [%s%s] %lld/%lld requests", std::string(filled, '#').c_str(),
                 std::string(kWidth - filled, '.').c_str(), static_cast<long long>(d), static_cast<long long>(total_));
    std::fflush(stderr);
  }

  const std::atomic<std::int64_t>& done_;
  std::int64_t total_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Sets out[row.report] for each row of `table` that has a replay key.
template <typename Table, typename S>
void AddReportFields(const Table& table, const S& s, nlohmann::json& out) {
  for (const auto& row : table) {
    if (!row.report.empty()) VisitStat(row, s, [&](const auto& v) { out[std::string(row.report)] = v; });
  }
}

// One item as `plan` sees it: its key, its entry's bytes, and its cost: the
// encode seconds measured for the key in this replay (`measured`, as the
// manifest's cost_s: the item the tower ran for it, or the L3 value's), else
// this replay's tower seconds per post-merge token times its tokens.
CacheAccess MrcAccess(const ContentKey& key, const Embedding& e, const WorkerStats& s,
                      const std::unordered_map<ContentKey, double, ContentKeyHash>& measured) {
  std::uint64_t h;
  std::memcpy(&h, key.bytes.data(), sizeof(h));
  if (auto m = measured.find(key); m != measured.end()) return {h, static_cast<std::int64_t>(e.nbytes()), m->second};
  const double per_token = s.tower_tokens == 0 ? 0 : s.tower_seconds / static_cast<double>(s.tower_tokens);
  return {h, static_cast<std::int64_t>(e.nbytes()), per_token * static_cast<double>(e.tokens)};
}

// --mrc: the curves of the items this replay served (epd/plan/plan.h), sized
// for the replay's own policy and L1 admission, with its L1/L2 limits.
PlanResult MrcOf(const std::vector<CacheAccess>& accesses, const ReplayFlags& f) {
  PlanOptions o;
  o.eviction = *ParseEvictionPolicy(f.worker.eviction);  // checked by the flag's validator
  o.l1_admission = *ParseL1Admission(f.worker.l1_admission);
  // As plan does: a window past the trace never ends within it, and its sketch would only take memory.
  o.doorkeeper_window =
      std::max<std::uint64_t>(1, std::min(static_cast<std::uint64_t>(f.worker.l1_admission_window), accesses.size()));
  o.l1_max_bytes = static_cast<double>(f.worker.cache_mb) * (1 << 20);
  o.l2_max_bytes = static_cast<double>(f.worker.host_cache_mb) * (1 << 20);
  o.replay = accesses.size() <= o.exact_max;  // plan's --replay auto
  PlanResult r = RunPlan(accesses, o);
  // The served items' sizes are at the replay's dtype.
  for (SizingRow& row : r.rows) {
    if (!row.serve_args.empty()) row.serve_args += " --dtype " + f.worker.dtype;
  }
  return r;
}

StatusOr<std::vector<TraceRequest>> BuildTrace(const ReplayFlags& f) {
  if (!f.trace.empty()) return ReadTrace(f.trace, static_cast<std::int64_t>(f.max_request_mb * (1 << 20)));
  auto images = ListImages(f.images);
  if (!images.ok()) return images.status();
  GeneratorOptions g;
  g.requests = f.generate;
  g.zipf_s = f.zipf;
  g.seed = f.seed;
  g.rate_per_s = f.rate;
  return GenerateTrace(*images, g);
}

// Each distinct file is read once; the requests that name it share its
// bytes (MediaBytes), so memory holds each file once however often the
// trace repeats it. kInvalidArgument names the request and the file that
// cannot be read.
StatusOr<std::map<std::string, MediaBytes>> ReadReplayMedia(const std::vector<TraceRequest>& trace,
                                                            const ReplayFlags& f) {
  std::map<std::string, MediaBytes> media;
  for (const TraceRequest& r : trace) {
    for (const std::string& p : r.paths()) {
      std::filesystem::path path(p);
      if (path.is_relative() && !f.images.empty()) path = std::filesystem::path(f.images) / path;
      if (media.count(p) != 0) continue;
      // Regular files only, each at most a request's size: a path naming
      // /dev/zero or a FIFO fails here at once.
      StatusOr<std::string> bytes =
          ReadRegularFile(path.string(), static_cast<std::int64_t>(f.max_request_mb * (1 << 20)));
      if (!bytes.ok()) {
        const bool video = std::find(r.videos.begin(), r.videos.end(), p) != r.videos.end();
        return InvalidArgument("request '" + r.id + "': cannot read " + (video ? "video " : "image ") + path.string() +
                               ": " + std::string(bytes.status().message()));
      }
      media[p] = MediaBytes(std::move(*bytes));
    }
  }
  return media;
}

// The worker's request for trace line `t`, its items sharing `media`'s bytes.
EncodeRequest MakeReplayRequest(const TraceRequest& t, std::map<std::string, MediaBytes>& media) {
  EncodeRequest req{t.id, {}};
  const std::vector<std::string> paths = t.paths();
  req.items.reserve(paths.size());
  for (std::size_t k = 0; k < paths.size(); ++k) {
    EncodeItemInput item;
    if (t.is_video(k)) {
      item.video = VideoInput{media[paths[k]], {}, std::nullopt};
    } else {
      item.media = media[paths[k]];
    }
    req.items.push_back(std::move(item));
  }
  return req;
}

// One replay's timeline: when it started, when each request was submitted
// and finished, and each request's result, in trace order.
struct ReplayRun {
  Clock::time_point start;
  std::vector<Clock::time_point> submitted, finished;
  std::vector<RequestResult> results;
};

// Submits every request (at its arrival_ms with --realtime), waits for all
// of them and shuts the loop down. A progress bar runs on a terminal.
void SubmitAndWait(WorkerLoop& loop, const std::vector<TraceRequest>& trace, std::map<std::string, MediaBytes>& media,
                   const ReplayFlags& f, ReplayRun& run) {
  const std::size_t n = trace.size();
  run.submitted.resize(n);
  run.finished.resize(n);
  std::vector<std::future<RequestResult>> futures;
  futures.reserve(n);
  std::atomic<std::int64_t> done{0};
  std::unique_ptr<ProgressBar> bar;
  if (isatty(STDERR_FILENO)) bar = std::make_unique<ProgressBar>(done, static_cast<std::int64_t>(n));
  run.start = Clock::now();
  for (std::size_t i = 0; i < n; ++i) {
    const TraceRequest& t = trace[i];
    if (f.realtime) {
      std::this_thread::sleep_until(run.start + std::chrono::duration_cast<Clock::duration>(
                                                    std::chrono::duration<double, std::milli>(t.arrival_ms)));
    }
    EncodeRequest req = MakeReplayRequest(t, media);
    run.submitted[i] = Clock::now();
    // finished[i] is written on the worker thread and read after the future
    // is ready, which orders the two.
    futures.push_back(loop.Submit(std::move(req), {nullptr, [&finished = run.finished, &done, i](const RequestResult&) {
                                                     finished[i] = Clock::now();
                                                     ++done;
                                                   }}));
  }
  run.results.reserve(n);
  for (auto& fut : futures) run.results.push_back(fut.get());
  loop.Shutdown(std::chrono::milliseconds(0));
  if (bar) bar->Stop();
}

// What the report says about a finished replay.
struct ReplaySummary {
  std::vector<double> latency;  // per request, ms, ascending
  std::set<ContentKey> distinct;
  std::map<ContentKey, EmbeddingPtr> embeddings;  // for --out
  std::map<std::string, std::int64_t> failures;   // status code name -> items
  std::string first_failure;
  std::int64_t items = 0, failed_items = 0, failed_requests = 0;
  std::vector<CacheAccess> accesses;  // for --mrc: one per embedded item, in trace order
  double wall_s = 0;
  double mean_batch_tokens = 0;
};

// Counts request `r`'s items into `sum`: keys, failures, --mrc accesses and
// --out embeddings.
void SummarizeItems(const RequestResult& r, const ReplayFlags& f, const WorkerStats& s,
                    const std::unordered_map<ContentKey, double, ContentKeyHash>& measured, ReplaySummary& sum) {
  for (const ItemResult& it : r.items) {
    if (it.status.ok()) {
      sum.distinct.insert(it.key);
      if (f.mrc && it.embedding != nullptr) sum.accesses.push_back(MrcAccess(it.key, *it.embedding, s, measured));
      if (!f.out.empty()) sum.embeddings.emplace(it.key, it.embedding);
    } else {
      ++sum.failures[std::string(StatusCodeName(it.status.code()))];
      ++sum.failed_items;
      if (sum.first_failure.empty()) {
        sum.first_failure = "request '" + r.id + "', item " + std::to_string(it.index) + ": " + it.status.ToString();
      }
    }
  }
}

ReplaySummary Summarize(const ReplayRun& run, const std::vector<TraceRequest>& trace, const WorkerStats& s,
                        const ReplayFlags& f) {
  ReplaySummary sum;
  // For --mrc: each key's measured cost, as the manifest's cost_s.
  const std::unordered_map<ContentKey, double, ContentKeyHash> measured =
      f.mrc ? MeasuredCosts(run.results) : std::unordered_map<ContentKey, double, ContentKeyHash>{};
  Clock::time_point last = run.start;
  for (std::size_t i = 0; i < run.results.size(); ++i) {
    const RequestResult& r = run.results[i];
    sum.latency.push_back(std::chrono::duration<double, std::milli>(run.finished[i] - run.submitted[i]).count());
    last = std::max(last, run.finished[i]);
    if (!r.status.ok()) {
      ++sum.failed_requests;
      if (sum.first_failure.empty()) sum.first_failure = "request '" + r.id + "': " + r.status.ToString();
    }
    sum.items += static_cast<std::int64_t>(trace[i].paths().size());
    SummarizeItems(r, f, s, measured, sum);
  }
  std::sort(sum.latency.begin(), sum.latency.end());
  sum.wall_s = std::chrono::duration<double>(last - run.start).count();
  sum.mean_batch_tokens =
      s.tower_batches == 0 ? 0 : static_cast<double>(s.tower_tokens) / static_cast<double>(s.tower_batches);
  return sum;
}

// --out: the embeddings as safetensors and, beside them, the manifest of
// which tensor is whose image: (request, item, media) -> key and grid.
Status WriteReplayOut(const ReplayFlags& f, const ReplaySummary& sum, const std::vector<TraceRequest>& trace,
                      const ReplayRun& run, const std::string& model_id) {
  std::vector<KeyedEmbedding> out;
  out.reserve(sum.embeddings.size());
  for (const auto& [key, e] : sum.embeddings) out.push_back({key, e});
  Status w = WriteEmbeddingsSafetensors(
      f.out, out,
      {{"producer", "epd-encode replay"}, {"model_id", model_id}, {"embeddings", std::to_string(out.size())}});
  if (!w.ok()) return w;
  return WriteReplayManifest(ManifestPathFor(f.out), trace, run.results, f.out);
}

// What the report prints besides the summary: the worker's and L3's counters.
struct ReplayCounters {
  WorkerStats worker;
  SharedTierStats l3;
  bool has_l3 = false;
  std::string model_id;
};

void PrintReplayJson(const ReplayFlags& f, std::size_t n, const ReplaySummary& sum, const ReplayCounters& c) {
  const WorkerStats& s = c.worker;
  // The counters go by their field tables' replay keys (epd/core/stat_fields.h).
  nlohmann::json j = {
      {"requests", n},
      {"items", sum.items},
      {"distinct_keys", sum.distinct.size()},
      {"failed_items", sum.failed_items},
      {"failed_requests", sum.failed_requests},
      {"errors", sum.failures},
      {"mean_batch_tokens", sum.mean_batch_tokens},
      {"latency_ms_p50", Percentile(sum.latency, 0.50)},
      {"latency_ms_p99", Percentile(sum.latency, 0.99)},
      {"items_per_s", sum.wall_s > 0 ? static_cast<double>(sum.items) / sum.wall_s : 0},
      {"wall_s", sum.wall_s},
      {"tower_busy_fraction", sum.wall_s > 0 ? std::min(1.0, s.tower_seconds / sum.wall_s) : 0},
      {"model_id", c.model_id},
  };
  AddReportFields(kWorkerStatsFields, s, j);
  if (c.has_l3) {
    nlohmann::json& l3j = j["l3"] = {{"errors", c.l3.errors}};
    AddReportFields(kSharedTierStatsFields, c.l3, l3j);
  }
  if (f.mrc) j["mrc"] = nlohmann::json::parse(PlanJson(MrcOf(sum.accesses, f)));
  std::fputs((j.dump() + "\n").c_str(), stdout);
}

// The text report's lines on what served the items: caches, L3, videos, tower.
std::string ServedText(const ReplaySummary& sum, const ReplayCounters& c) {
  const WorkerStats& s = c.worker;
  std::string o = fmt::format(
      "  served     L1 hits {}, L2 hits {}, L3 hits {}, in-flight joins {}, misses {} ({} shape mismatches)\n",
      s.hits_l1, s.hits_l2, s.hits_l3, s.joins, s.misses, s.shape_mismatches);
  if (c.has_l3) {
    const SharedTierStats& l3 = c.l3;
    std::uint64_t errors = 0;
    for (const auto& [kind, count] : l3.errors) errors += count;
    o += fmt::format("  l3         {} gets, {} hits, {} corrupt, {} writes ({} dropped), {} lease waits, {} errors{}\n",
                     l3.gets, l3.hits, l3.corrupt, l3.writes, l3.write_drops, l3.lease_waits, errors,
                     l3.degraded ? " (degraded)" : "");
  }
  if (s.video_items > 0) {
    o += fmt::format("  videos     {} items, {} decoded; chunks: {} hits, {} joins, {} misses\n", s.video_items,
                     s.video_decodes, s.chunk_hits, s.chunk_joins, s.chunk_misses);
  }
  o += fmt::format("  tower      {} batches, {} items, {:.1f} tokens per batch, {:.3f} s\n", s.tower_batches,
                   s.tower_items, sum.mean_batch_tokens, s.tower_seconds);
  return o;
}

void PrintReplayText(const ReplayFlags& f, std::size_t n, const ReplaySummary& sum, const ReplayCounters& c) {
  const WorkerStats& s = c.worker;
  const double wall_s = sum.wall_s;
  std::string o = fmt::format("replay: {} requests, {} items, {} distinct keys\n", n, sum.items, sum.distinct.size());
  o += ServedText(sum, c);
  o += fmt::format("  latency    p50 {:.1f} ms, p99 {:.1f} ms\n", Percentile(sum.latency, 0.50),
                   Percentile(sum.latency, 0.99));
  o += fmt::format("  throughput {:.1f} items/s, wall {:.3f} s (tower busy {:.1f}% of it)\n",
                   wall_s > 0 ? static_cast<double>(sum.items) / wall_s : 0, wall_s,
                   wall_s > 0 ? 100 * std::min(1.0, s.tower_seconds / wall_s) : 0.0);
  o += fmt::format("  cache      L1 {:.1f} MB, L2 {:.1f} MB, {} demotions, {} promotions\n",
                   static_cast<double>(s.l1_used_bytes) / (1 << 20), static_cast<double>(s.l2_used_bytes) / (1 << 20),
                   s.demotions, s.promotions);
  if (sum.failed_items > 0 || sum.failed_requests > 0) {
    o += fmt::format("  failed     {} items, {} requests; first: {}\n", sum.failed_items, sum.failed_requests,
                     sum.first_failure);
  }
  if (!f.out.empty()) {
    o += fmt::format("  wrote      {} embeddings to {}, manifest {}\n", sum.embeddings.size(), f.out,
                     ManifestPathFor(f.out));
  }
  if (f.mrc) o += "\n" + PlanText(MrcOf(sum.accesses, f));
  std::fputs(o.c_str(), stdout);
}

// The trace (read or generated), written out for --write-trace.
StatusOr<std::vector<TraceRequest>> PrepareTrace(const ReplayFlags& f) {
  if (f.trace.empty() == (f.generate == 0)) return InvalidArgument("give exactly one of --trace FILE or --generate N");
  if (f.generate > 0 && f.images.empty()) return InvalidArgument("--generate needs --images DIR");
  StatusOr<std::vector<TraceRequest>> trace = BuildTrace(f);
  if (!trace.ok() || f.write_trace.empty()) return trace;
  std::ofstream w(f.write_trace);
  w << TraceToJsonLines(*trace);
  if (!w) return InvalidArgument("cannot write " + f.write_trace);
  return trace;
}

int RunReplay(const ReplayFlags& f) {
  StatusOr<std::vector<TraceRequest>> trace = PrepareTrace(f);
  if (!trace.ok()) return CommandError("replay", trace.status().message());
  StatusOr<std::map<std::string, MediaBytes>> media = ReadReplayMedia(*trace, f);
  if (!media.ok()) return CommandError("replay", media.status().message());

  TuneMalloc(MallocUse::kTower);
  auto worker = MakeWorker(f.worker);
  if (!worker.ok()) return CommandError("replay", worker.status().ToString());
  spdlog::info("replay: {} requests, {} distinct files; tower {}", trace->size(), media->size(),
               (*worker)->tower().Describe());
  ReplayCounters c;
  c.model_id = (*worker)->options().model_id;
  WorkerLoop loop(std::move(*worker));
  ReplayRun run;
  SubmitAndWait(loop, *trace, *media, f, run);
  c.worker = loop.Stats();
  c.l3 = loop.SharedTierStatsSnapshot();
  c.has_l3 = loop.has_shared_tier();

  const ReplaySummary sum = Summarize(run, *trace, c.worker, f);
  if (!f.out.empty()) {
    if (Status s = WriteReplayOut(f, sum, *trace, run, c.model_id); !s.ok())
      return CommandError("replay", s.ToString());
  }
  if (f.json) {
    PrintReplayJson(f, trace->size(), sum, c);
  } else {
    PrintReplayText(f, trace->size(), sum, c);
  }
  return sum.failed_items > 0 || sum.failed_requests > 0 ? 3 : 0;
}

}  // namespace

void RegisterReplayCommand(CLI::App& app) {
  auto f = std::make_shared<ReplayFlags>();
  CLI::App* cmd = app.add_subcommand(
      "replay", "Replay a trace of image requests through the encode worker and summarise (docs/REPLAY.md)");
  AddWorkerFlags(*cmd, f->worker);
  CLI::Option* trace =
      cmd->add_option("--trace", f->trace, "JSON Lines trace, one request per line")->check(CLI::ExistingFile);
  cmd->add_option("--images", f->images, "image directory: trace paths are relative to it; --generate draws from it")
      ->check(CLI::ExistingDirectory);
  CLI::Option* gen = cmd->add_option("--generate", f->generate, "generate N requests over the images in --images")
                         ->check(Integer(1, 10'000'000));
  trace->excludes(gen);
  cmd->add_option("--zipf", f->zipf, "Zipf exponent of image popularity (0 = uniform)")
      ->capture_default_str()
      ->check(NonNegative());
  cmd->add_option("--seed", f->seed, "generator seed")->capture_default_str();
  cmd->add_option("--rate", f->rate, "generated arrival rate, requests/s (matters with --realtime)")
      ->capture_default_str()
      ->check(Positive("requests/s"));
  cmd->add_option("--write-trace", f->write_trace, "also write the (generated) trace as JSON Lines");
  cmd->add_option("--max-request-mb", f->max_request_mb,
                  "largest file read (the trace, each image and video), MB: serve's request limit; only regular "
                  "files are read")
      ->capture_default_str()
      ->check(Positive("MB"));
  CLI::Option* rt = cmd->add_flag("--realtime", f->realtime, "submit each request at its arrival_ms");
  CLI::Option* fast =
      cmd->add_flag("--as-fast-as-possible", f->as_fast_as_possible, "submit every request at once (the default)");
  rt->excludes(fast);
  cmd->add_flag("--json", f->json, "print one JSON object instead of the human summary");
  cmd->add_flag("--mrc", f->mrc, "add the items' miss-ratio curves and tier sizing (as `plan`, docs/PLAN.md)");
  cmd->add_option("--out", f->out,
                  "write the embeddings as safetensors, and a manifest (request, item, image -> key, grid) "
                  "beside it: FILE.safetensors -> FILE.manifest.jsonl");
  cmd->callback([f] {
    const int rc = RunReplay(*f);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace epd::cli
