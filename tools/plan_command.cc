// `epd-encode plan`: sizes the cache tiers from a trace (docs/PLAN.md).
//
// Input: a cache trace (key, bytes, cost_s per line; tools/cache_trace.h),
// or a replay trace (images per request; docs/REPLAY.md) with --images and
// --model, from which each image's content key, entry size (post-merge
// tokens x hidden x (1 + deepstack layers) x dtype bytes, from its header)
// and cost (tokens x --seconds-per-token) are derived without decoding.
// Output: the curves, the sizing table and (--replay) the replayed hit
// ratios (tools/plan.h), as text or --json; --plot draws the curves.
// --replay auto replays when the trace has at most --exact-max requests
// (there a replay costs about what the exact curve does); above, the plan is
// the sampled curves and miniatures alone unless --replay on asks for the
// check.
//
// Exit codes: 0 done; 1 usage or input error (a malformed trace names its
// line; a missing gnuplot with --plot fails before any work).
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>

#include "cache_trace.h"
#include "cli_util.h"
#include "commands.h"
#include "epd/plan/plan.h"
#include "flag_checks.h"
#include "plan_plot.h"
#include "trace.h"
#ifdef EPD_WITH_INSPECT_MODEL
#include "epd/media/content_key.h"
#include "epd/media/preprocess.h"
#include "epd/model/checkpoint.h"
#endif

namespace epd::cli {

using plan::PlanJson;
using plan::PlanOptions;
using plan::PlanResult;
using plan::PlanText;
using plan::RunPlan;
using plan::SizingRow;

namespace {

struct PlanFlags {
  std::string trace, images, model, plot, eviction = "gdsf", admission = "none", dtype = "float32", replay = "auto";
  bool json = false, progress = false;
  double l1_max_gb = 16, l2_max_gb = 256, seconds_per_byte = 1e-9, seconds_per_token = 1.25e-5;
  double shards_rate = 0.05, minisim_rate = 0.05;
  std::int64_t exact_max = 1'000'000, shards_max_keys = 131072, window = 65536, threads = 0;
};

// A one-line bar on stderr, redrawn at most every 100 ms by the caller's thread.
class PhaseBar {
 public:
  explicit PhaseBar(bool on) : on_(on) {}
  ~PhaseBar() { EndLine(); }
  void Update(const char* phase, std::size_t done, std::size_t total) {
    if (!on_) return;
    const auto now = std::chrono::steady_clock::now();
    if (drawn_ && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    drawn_ = true;
    const int width = 30, filled = total == 0 ? width : static_cast<int>(width * done / total);
    std::fprintf(stderr, "\rplan %-18s [%s%s] %3d%%", phase, std::string(filled, '#').c_str(),
                 std::string(width - filled, '.').c_str(), total == 0 ? 100 : static_cast<int>(100 * done / total));
    std::fflush(stderr);
  }

  // Draws 100 % whatever the time since the last redraw.
  void Finish() {
    if (!on_) return;
    drawn_ = false;
    Update("done", 1, 1);
    EndLine();
  }

  // Ends the bar's line, so that what stderr says next starts its own.
  void EndLine() {
    if (drawn_) std::fputc('\n', stderr);
    drawn_ = false;
  }

 private:
  bool on_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point last_{};
};

#ifdef EPD_WITH_INSPECT_MODEL
// Keys, sizes and modelled costs of a replay trace's images, from headers.
StatusOr<std::vector<CacheAccess>> FromReplayTrace(const PlanFlags& f) {
  auto trace = ReadTrace(f.trace);
  if (!trace.ok()) return trace.status();
  auto ckpt = OpenCheckpoint(f.model);
  if (!ckpt.ok()) return ckpt.status();
  const PreprocessConfig& cfg = (*ckpt)->preprocess();
  const VisionConfig& v = (*ckpt)->vision();
  const std::int64_t per_token = v.out_hidden * (1 + v.deepstack_layers()) * (f.dtype == "float32" ? 4 : 2);
  std::map<std::string, CacheAccess> seen;  // path -> its access
  std::vector<CacheAccess> out;
  for (const TraceRequest& r : *trace) {
    if (!r.videos.empty()) return InvalidArgument("request '" + r.id + "': plan derives images only, not videos");
    for (const std::string& p : r.images) {
      auto it = seen.find(p);
      if (it == seen.end()) {
        std::filesystem::path path(p);
        if (path.is_relative() && !f.images.empty()) path = std::filesystem::path(f.images) / path;
        StatusOr<std::string> bytes = ReadRegularFile(path.string());
        if (!bytes.ok()) return InvalidArgument("request '" + r.id + "': " + bytes.status().message());
        const auto* data = reinterpret_cast<const std::uint8_t*>(bytes->data());
        auto grid = ProbeGrid({data, bytes->size()}, cfg);
        if (!grid.ok()) return InvalidArgument("request '" + r.id + "', " + p + ": " + grid.status().message());
        const std::int64_t tokens = grid->grid.tokens(cfg.merge_size);
        const ContentKey key = ComputeContentKey((*ckpt)->model_id(), cfg, {data, bytes->size()});
        it = seen.emplace(p, CacheAccess{KeyHash(key.Hex()), tokens * per_token,
                                         static_cast<double>(tokens) * f.seconds_per_token})
                 .first;
      }
      out.push_back(it->second);
    }
  }
  return out;
}
#endif

// `derived` is set where the trace is a replay trace, whose sizes plan
// derives at --dtype.
StatusOr<std::vector<CacheAccess>> LoadTrace(const PlanFlags& f, PhaseBar& bar, bool& derived) {
  // A regular file only: /dev/zero or a FIFO would be read without end.
  StatusOr<std::string> text = ReadRegularFile(f.trace);
  if (!text.ok()) return InvalidArgument("trace: " + text.status().message());
  if (LooksLikeReplayTrace(*text)) {
    if (f.model.empty()) {
      return InvalidArgument(f.trace +
                             " is a replay trace (images per request): give --model DIR (and --images DIR) "
                             "to derive keys, sizes and costs, or a cache trace (docs/PLAN.md)");
    }
#ifdef EPD_WITH_INSPECT_MODEL
    derived = true;
    return FromReplayTrace(f);
#else
    return InvalidArgument("this epd-encode was built without epd::model: --model is unavailable");
#endif
  }
  if (!f.model.empty() || !f.images.empty()) {
    std::fprintf(stderr,
                 "plan: %s is a cache trace, which carries its own keys, sizes and costs: --model and --images "
                 "(for a replay trace) are ignored\n",
                 f.trace.c_str());
  }
  CacheTraceOptions o;
  o.default_seconds_per_byte = f.seconds_per_byte;
  o.progress = [&bar](std::size_t done, std::size_t total) { bar.Update("read", done, total); };
  std::size_t skipped = 0;
  o.skipped = &skipped;
  StatusOr<std::vector<CacheAccess>> trace = ParseCacheTrace(*text, f.trace, o);
  if (trace.ok() && skipped > 0) {
    std::fprintf(stderr, "plan: skipped %zu failed item(s) of %s (lines with an error and no bytes)\n", skipped,
                 f.trace.c_str());
  }
  return trace;
}

int RunPlanCommand(const PlanFlags& f) {
  auto eviction = ParseEvictionPolicy(f.eviction);
  if (!eviction.ok()) return CommandError("plan", eviction.status().message());
  auto admission = ParseL1Admission(f.admission);
  if (!admission.ok()) return CommandError("plan", admission.status().message());
  if (!f.plot.empty() && !HaveGnuplot()) {
    return CommandError("plan", "--plot needs gnuplot, which is not on PATH (Debian package gnuplot-nox)");
  }
  if (Status s = CheckPlotFile(f.plot); !f.plot.empty() && !s.ok()) return CommandError("plan", s.message());
  PhaseBar bar(f.progress || isatty(STDERR_FILENO));
  bool derived = false;
  auto trace = LoadTrace(f, bar, derived);
  // An error starts a line of its own, not the bar's.
  auto fail = [&bar](const std::string& message) {
    bar.EndLine();
    return CommandError("plan", message);
  };
  if (!trace.ok()) return fail(trace.status().message());

  PlanOptions o;
  o.eviction = *eviction;
  o.l1_admission = *admission;
  o.l1_max_bytes = f.l1_max_gb * 1e9 + 0.0;  // + 0.0: -0 GB is 0 bytes, not "-0 B"
  o.l2_max_bytes = f.l2_max_gb * 1e9 + 0.0;
  o.exact_max = static_cast<std::size_t>(f.exact_max);
  o.shards_rate = f.shards_rate;
  o.shards_max_keys = static_cast<std::size_t>(f.shards_max_keys);
  o.minisim_rate = f.minisim_rate;
  o.replay = f.replay == "on" || (f.replay == "auto" && trace->size() <= o.exact_max);
  o.threads = static_cast<unsigned>(f.threads);
  // A window longer than the trace admits as one as long as the trace (it
  // never ends within it), and the doorkeeper's memory is sized by it.
  o.doorkeeper_window = std::max<std::uint64_t>(
      1, std::min(static_cast<std::uint64_t>(f.window), static_cast<std::uint64_t>(trace->size())));
  o.worker_window = static_cast<std::uint64_t>(f.window);
  o.progress = [&bar](const char* phase, std::size_t done, std::size_t total) { bar.Update(phase, done, total); };
  PlanResult r;
  try {
    r = RunPlan(*trace, o);
  } catch (const std::invalid_argument& e) {  // a trace RunPlan cannot size (plan.h)
    return fail(f.trace + ": " + e.what());
  } catch (const std::exception& e) {  // a bug's last line of defence: said, never an abort
    return fail(std::string("internal error: ") + e.what());
  }
  // Sizes derived from images hold at the dtype they were derived at.
  if (derived) {
    for (SizingRow& row : r.rows) {
      if (!row.serve_args.empty()) row.serve_args += " --dtype " + f.dtype;
    }
  }
  bar.Finish();
  std::fputs((f.json ? PlanJson(r) : PlanText(r)).c_str(), stdout);
  if (!f.plot.empty()) {
    Status s = PlotCurves(r.curves, fmt::format("{} ({} requests)", f.trace, r.requests), f.plot);
    if (!s.ok()) return CommandError("plan", s.message());
    std::fprintf(stderr, "plan: drew the curves to %s\n", f.plot.c_str());  // no control characters (CheckPlotFile)
  }
  return 0;
}

}  // namespace

void RegisterPlanCommand(CLI::App& app) {
  auto f = std::make_shared<PlanFlags>();
  CLI::App* cmd = app.add_subcommand("plan", "Size the cache tiers from a trace: miss-ratio curves (docs/PLAN.md)");
  cmd->add_option("--trace", f->trace, "cache trace (key, bytes, cost_s per line) or replay trace")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--images", f->images, "a replay trace's image directory")->check(CLI::ExistingDirectory);
  cmd->add_option("--model", f->model, "checkpoint directory, to derive a replay trace's keys and sizes")
      ->check(CLI::ExistingDirectory);
  // A flag with its default shown and a check.
  auto option = [cmd](const char* name, auto& value, const char* help, const CLI::Validator& check) {
    cmd->add_option(name, value, help)->capture_default_str()->check(check);
  };
  option("--dtype", f->dtype, "embedding dtype for a replay trace's derived sizes (as the worker's --dtype)",
         CLI::IsMember({"float32", "bfloat16"}));
  option("--seconds-per-token", f->seconds_per_token, "derived cost per post-merge token, s", NonNegative("s"));
  option("--seconds-per-byte", f->seconds_per_byte, "cost of a cache-trace line without cost_s, s/B",
         NonNegative("s/B"));
  option("--eviction", f->eviction, "policy the tiers are sized for", CLI::IsMember({"lru", "gdsf", "adaptive"}));
  option("--l1-admission", f->admission, "L1 admission filter", CLI::IsMember({"none", "doorkeeper"}));
  // The doorkeeper takes about 6 bytes per windowed request (admission_filter.h): 2^27 is 0.8 GB.
  option("--window", f->window, "doorkeeper window, requests (at most 2^27)", Integer(1, std::int64_t{1} << 27));
  option("--l1-max-gb", f->l1_max_gb, "device memory L1 may take, GB", NonNegative("GB"));
  option("--l2-max-gb", f->l2_max_gb, "host memory L2 may take, GB", NonNegative("GB"));
  option("--exact-max", f->exact_max, "exact stack distances up to this many requests, SHARDS above", Integer(0));
  option("--shards-rate", f->shards_rate, "SHARDS tail sampling rate", Number(0, 1, "", true));
  option("--shards-max-keys", f->shards_max_keys, "SHARDS tail keys kept at most (fixed memory)", Integer(1));
  option("--minisim-rate", f->minisim_rate, "MiniSim sampling rate for the GDSF curves", Number(0, 1, "", true));
  option("--replay", f->replay,
         "replay the whole trace through the real tiers at each recommended size (auto: "
         "when the trace has at most --exact-max requests)",
         CLI::IsMember({"auto", "on", "off"}));
  option("--threads", f->threads, "curves, miniatures and replays run at once (0: one per core)", Integer(0, 1024));
  cmd->add_flag("--json", f->json, "print one JSON object instead of the tables");
  cmd->add_option("--plot", f->plot, "also draw the curves to this PNG (needs gnuplot)");
  cmd->add_flag("--progress", f->progress, "draw the progress bar even when stderr is not a terminal");
  cmd->callback([f] {
    const int rc = RunPlanCommand(*f);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace epd::cli
