// video_tenant_bench: another tenant's image miss while one tenant's large
// videos decode (issue 40, B67; docs/VIDEO.md, "Tenants and pending
// decodes"). A reproducer run by hand, not a timed test.
//
// It drives the real worker (WorkerLoop over EncodeWorker, as the server
// does) with the real container decoder (epd::video's DecodeVideo) and the
// test tower (FakeTower: its rows are a function of the input, so the tower
// itself costs next to nothing and what is measured is the wait). Two
// tenants:
//   a   submits --videos MJPEG videos of --side x --side pixels, --frames
//       frames each (made with the ffmpeg CLI; each of its own bytes, so
//       each decodes), all at once;
//   b   sends --misses fresh 512x512 PNGs (each a miss), one call at a time.
// Phases:
//   solo    b alone;
//   loaded  b starting right after a's videos were submitted, for as long
//           as they are pending (the calls sent while they were).
// Prints each phase's p50 / p99 / max in milliseconds and one JSON object
// (schema "epd-bench-video-tenant/1"); the target is loaded p50 <= 2 x solo
// p50.
//
// Usage: video_tenant_bench [--side 4000] [--frames 4] [--videos 3]
//                           [--misses 20] [--order fair|fifo]
//                           [--decode-threads 1]
// Needs the ffmpeg CLI on PATH.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <string>
#include <vector>

#include "epd/video/video_decoder.h"
#include "epd/worker/encode_worker.h"
#include "epd/worker/worker_loop.h"
#include "fake_tower.h"
#include "test_images.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  int side = 4000;
  int frames = 4;
  int videos = 3;
  int misses = 20;
  std::string order = "fair";
  int decode_threads = 1;
};

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--side") a.side = std::stoi(v);
    if (k == "--frames") a.frames = std::stoi(v);
    if (k == "--videos") a.videos = std::stoi(v);
    if (k == "--misses") a.misses = std::stoi(v);
    if (k == "--order") a.order = v;
    if (k == "--decode-threads") a.decode_threads = std::stoi(v);
  }
  return a;
}

// Reports a failure and ends the process at once (the worker's threads may
// be running: std::exit's handlers are not thread-safe).
[[noreturn]] void Fail(const std::string& why) {
  std::fprintf(stderr, "video_tenant_bench: %s\n", why.c_str());
  std::fflush(stdout);
  std::_Exit(1);
}

// An MJPEG AVI of testsrc2 frames; `seed` turns the hue so each file differs.
std::string MakeVideo(const std::filesystem::path& dir, const Args& a, int seed) {
  const std::filesystem::path path = dir / ("v" + std::to_string(seed) + ".avi");
  const std::string cmd = "ffmpeg -v error -nostdin -y -f lavfi -i testsrc2=size=" + std::to_string(a.side) + "x" +
                          std::to_string(a.side) + ":rate=2,hue=h=" + std::to_string(seed * 37 % 360) + " -frames:v " +
                          std::to_string(a.frames) + " -c:v mjpeg -q:v 8 " + path.string();
  // NOLINTNEXTLINE(concurrency-mt-unsafe): runs before the worker starts any thread.
  if (std::system(cmd.c_str()) != 0) Fail("ffmpeg failed: " + cmd);
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A 512x512 PNG of its own bytes for each seed: always a miss.
std::string FreshImage(int seed) {
  epd::RgbImage img = epd::testing::PatternImage(512, 512);
  for (std::size_t i = 0; i < img.pixels.size(); i += 97) {
    img.pixels[i] = static_cast<std::uint8_t>(static_cast<std::size_t>(seed) * 131 + i);
  }
  img.pixels[0] = static_cast<std::uint8_t>(seed);
  img.pixels[1] = static_cast<std::uint8_t>(seed >> 8);
  const epd::testing::Bytes b = epd::testing::EncodePngRgb(img);
  return {b.begin(), b.end()};
}

epd::EncodeRequest Request(std::string id, std::string tenant, epd::EncodeItemInput item) {
  epd::EncodeRequest r{std::move(id), {}};
  r.tenant = std::move(tenant);
  r.items.push_back(std::move(item));
  return r;
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto i = static_cast<std::size_t>(std::lround(q / 100.0 * static_cast<double>(v.size() - 1)));
  return v[std::min(i, v.size() - 1)];
}

// One call of b's, of an image made beforehand: its latency in ms (a failed
// call ends the process).
double Miss(epd::WorkerLoop& loop, const std::vector<std::string>& images, int seed) {
  epd::EncodeItemInput item;
  item.media = images[static_cast<std::size_t>(seed - 1)];
  const Clock::time_point t0 = Clock::now();
  const epd::RequestResult r = loop.Submit(Request("b" + std::to_string(seed), "b", std::move(item))).get();
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  if (!r.all_ok() || r.items[0].source != epd::ItemSource::kMiss) {
    Fail("b's call " + std::to_string(seed) + " failed or was not a miss");
  }
  return ms;
}

struct Phase {
  std::vector<double> ms;
  void Print(const char* name) const {
    std::printf("%-7s n=%zu  p50 %.1f ms  p99 %.1f ms  max %.1f ms\n", name, ms.size(), Percentile(ms, 50),
                Percentile(ms, 99), Percentile(ms, 100));
  }
  std::string Json() const {
    char buf[160];
    std::snprintf(buf, sizeof buf, "{\"n\": %zu, \"p50_ms\": %.2f, \"p99_ms\": %.2f, \"max_ms\": %.2f}", ms.size(),
                  Percentile(ms, 50), Percentile(ms, 99), Percentile(ms, 100));
    return buf;
  }
};

std::unique_ptr<epd::EncodeWorker> MakeWorker(const Args& a) {
  epd::WorkerOptions o;
  o.model_id = "video-tenant-bench";
  o.order = a.order == "fifo" ? epd::ScheduleOrder::kFifo : epd::ScheduleOrder::kFair;
  o.decode_threads = a.decode_threads;
  o.decode_video = epd::DecodeVideo;
  auto w = epd::EncodeWorker::Create(std::move(o), std::make_unique<epd::testing::FakeTower>());
  if (!w.ok()) Fail(w.status().ToString());
  return std::move(*w);
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = Parse(argc, argv);
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("video_tenant_bench." + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::vector<std::string> videos;
  videos.reserve(static_cast<std::size_t>(a.videos));
  for (int i = 0; i < a.videos; ++i) videos.push_back(MakeVideo(dir, a, i + 1));
  std::filesystem::remove_all(dir);

  std::vector<std::string> images;  // b's, all made before the clock runs
  images.reserve(2 * static_cast<std::size_t>(a.misses));
  for (int i = 1; i <= 2 * a.misses; ++i) images.push_back(FreshImage(i));

  epd::WorkerLoop loop(MakeWorker(a));
  Phase solo, loaded;
  int seed = 0;
  for (int i = 0; i < a.misses; ++i) solo.ms.push_back(Miss(loop, images, ++seed));

  const Clock::time_point t0 = Clock::now();
  std::vector<std::future<epd::RequestResult>> pending;
  pending.reserve(static_cast<std::size_t>(a.videos));
  for (int i = 0; i < a.videos; ++i) {
    epd::EncodeItemInput item;
    item.video = epd::VideoInput{epd::MediaBytes(videos[static_cast<std::size_t>(i)]), {}, std::nullopt};
    pending.push_back(loop.Submit(Request("a" + std::to_string(i), "a", std::move(item))));
  }
  auto videos_pending = [&] {
    return std::any_of(pending.begin(), pending.end(),
                       [](auto& f) { return f.wait_for(std::chrono::seconds(0)) != std::future_status::ready; });
  };
  // A call counts when it was sent while a's videos were pending.
  for (int i = 0; i < a.misses && videos_pending(); ++i) loaded.ms.push_back(Miss(loop, images, ++seed));
  const double loaded_s = std::chrono::duration<double>(Clock::now() - t0).count();
  for (auto& f : pending) {
    if (!f.get().all_ok()) std::fprintf(stderr, "video_tenant_bench: a video failed\n");
  }
  const double videos_s = std::chrono::duration<double>(Clock::now() - t0).count();

  solo.Print("solo");
  loaded.Print("loaded");
  std::printf(
      "a's %d videos (%dx%d, %d frames) done after %.1f s; b's loaded calls ended after %.1f s; "
      "loaded/solo p50 = %.2f\n",
      a.videos, a.side, a.side, a.frames, videos_s, loaded_s,
      Percentile(loaded.ms, 50) / std::max(Percentile(solo.ms, 50), 1e-9));
  std::printf(
      "{\"schema\": \"epd-bench-video-tenant/1\", \"order\": \"%s\", \"side\": %d, \"frames\": %d, "
      "\"videos\": %d, \"solo\": %s, \"loaded\": %s, \"videos_s\": %.2f, \"loaded_s\": %.2f}\n",
      a.order.c_str(), a.side, a.frames, a.videos, solo.Json().c_str(), loaded.Json().c_str(), videos_s, loaded_s);
  return 0;
}
