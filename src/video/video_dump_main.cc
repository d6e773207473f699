// epd_video_dump (test tool): decodes and samples one video file exactly as
// the encode path does (epd::DecodeVideo) and prints what it chose, so a test
// in another language can check it against its own reading of the reference
// pipeline (tests/python/test_video_sampling.py). Not installed.
//
// Usage:
//   epd_video_dump [--patch P] [--fps F | --nframes N] [--min-frames N]
//                  [--max-frames N] [--min-pixels N] [--max-pixels N]
//                  [--total-pixels N] [--resized H W] [--out-dir DIR] FILE
// --patch sets PreprocessConfig::patch_size and the VideoSampling::ForPatchSize
// pixel defaults (applied before the other options). Prints "key value..."
// lines (doubles with 17 significant digits):
//   container, codec, source_size W H, header_frames, source_fps,
//   duration_s (ProbeVideo), then source_frames (frames counted), frames
//   (sampled), resized H W, grid T H W, sample_fps, seconds_per_grid_t,
//   timestamps t0 t1 ...
// With --out-dir, frame I goes to DIR/frame_III.rgb (W * H * 3 bytes, RGB8).
// On a decode error prints "error CODE MESSAGE" and exits 1; bad usage or an
// unreadable file exits 2.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "epd/video/video_decoder.h"

namespace {

int Usage(const char* why) {
  std::fprintf(stderr,
               "epd_video_dump: %s\nusage: epd_video_dump [--patch P] [--fps F | --nframes N] [--min-frames N] "
               "[--max-frames N] [--min-pixels N] [--max-pixels N] [--total-pixels N] [--resized H W] "
               "[--out-dir DIR] FILE\n",
               why);
  return 2;
}

// What the command line asks for.
struct DumpArgs {
  epd::PreprocessConfig cfg;
  epd::VideoSampling sampling;
  std::string out_dir, file;
};

// --patch first: it sets the patch size and resets the pixel defaults the
// other flags then override.
void ApplyPatchFlag(const std::vector<std::string_view>& args, DumpArgs* d) {
  for (std::size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == "--patch") {
      d->cfg.patch_size = std::atoi(std::string(args[i + 1]).c_str());
      d->sampling = epd::VideoSampling::ForPatchSize(d->cfg.patch_size);
    }
  }
}

// The arguments into `d`; what is wrong with them for Usage, or "" when
// nothing is. An option without its value reads as "" (so 0).
std::string ParseArgs(const std::vector<std::string_view>& args, DumpArgs* d) {
  ApplyPatchFlag(args, d);
  epd::VideoSampling& s = d->sampling;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string_view a = args[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= args.size()) return {};
      return std::string(args[++i]);
    };
    auto next_int = [&]() { return std::strtoll(next().c_str(), nullptr, 10); };
    if (a == "--patch") {
      ++i;
    } else if (a == "--fps") {
      s.fps = std::strtod(next().c_str(), nullptr);
    } else if (a == "--nframes") {
      s.nframes = next_int();
    } else if (a == "--min-frames") {
      s.min_frames = next_int();
    } else if (a == "--max-frames") {
      s.max_frames = next_int();
    } else if (a == "--min-pixels") {
      s.min_pixels = next_int();
    } else if (a == "--max-pixels") {
      s.max_pixels = next_int();
    } else if (a == "--total-pixels") {
      s.total_pixels = next_int();
    } else if (a == "--resized") {
      s.resized_height = next_int();
      s.resized_width = next_int();
    } else if (a == "--out-dir") {
      d->out_dir = next();
    } else if (!a.empty() && a[0] == '-') {
      return "unknown option " + std::string(a);
    } else if (d->file.empty()) {
      d->file = std::string(a);
    } else {
      return "more than one FILE";
    }
  }
  return d->file.empty() ? "no FILE" : "";
}

// A decode error's line; exit status 1.
int Fail(const epd::Status& st) {
  std::string m = st.message();
  for (char& c : m) {
    if (c == '\n') c = ' ';
  }
  std::printf("error %d %s\n", static_cast<int>(st.code()), m.c_str());
  return 1;
}

void PrintSampled(const epd::SampledVideo& video) {
  const epd::RgbImage& f0 = video.frames.front();
  std::printf(
      "source_frames %lld\nframes %zu\nresized %d %d\ngrid %lld %lld %lld\nsample_fps %.17g\n"
      "seconds_per_grid_t %.17g\ntimestamps",
      static_cast<long long>(video.source_frames), video.frames.size(), f0.height, f0.width,
      static_cast<long long>(video.grid.t), static_cast<long long>(video.grid.h), static_cast<long long>(video.grid.w),
      video.sample_fps, video.seconds_per_grid_t);
  for (double t : video.timestamps_s) std::printf(" %.17g", t);
  std::printf("\n");
}

// Frame I to DIR/frame_III.rgb.
void WriteFrames(const epd::SampledVideo& video, const std::string& out_dir) {
  std::filesystem::create_directories(out_dir);
  for (std::size_t i = 0; i < video.frames.size(); ++i) {
    char name[32];
    std::snprintf(name, sizeof(name), "frame_%03zu.rgb", i);
    std::ofstream o(std::filesystem::path(out_dir) / name, std::ios::binary);
    o.write(reinterpret_cast<const char*>(video.frames[i].pixels.data()),
            static_cast<std::streamsize>(video.frames[i].pixels.size()));
  }
}

}  // namespace

int main(int argc, char** argv) {
  DumpArgs d;
  const std::vector<std::string_view> args(argv + 1, argv + argc);
  if (const std::string why = ParseArgs(args, &d); !why.empty()) return Usage(why.c_str());
  std::ifstream in(d.file, std::ios::binary);
  if (!in) return Usage(("cannot read " + d.file).c_str());
  const std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());

  auto info = epd::ProbeVideo(bytes);
  if (!info.ok()) return Fail(info.status());
  std::printf(
      "container %s\ncodec %s\nsource_size %lld %lld\nheader_frames %lld\nsource_fps %.17g\n"
      "duration_s %.17g\n",
      info->container.c_str(), info->codec.c_str(), static_cast<long long>(info->width),
      static_cast<long long>(info->height), static_cast<long long>(info->frames), info->fps, info->duration_s);
  auto video = epd::DecodeVideo(bytes, d.sampling, d.cfg);
  if (!video.ok()) return Fail(video.status());
  PrintSampled(*video);
  if (!d.out_dir.empty()) WriteFrames(*video, d.out_dir);
  return 0;
}
