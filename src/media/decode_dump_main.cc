// epd_decode_dump (test tool): decodes images exactly as the encode path
// does and writes the RGB8 pixels out, so a test in another language can
// compare them with another decoder (tests/python/test_pillow_parity.py
// compares them with Pillow). Not installed; built with the media tests.
//
// Usage:
//   epd_decode_dump --out-dir DIR [--no-exif-orientation]
//                   [--rgba-background white|none|R,G,B]
//                   [--max-decode-pixels N] [--resize W H [--bilinear]]
//                   [--rows [--dct-scaling]] FILE...
// For each FILE, one tab-separated line on stdout:
//   FILE ok W H ORIENTATION HEADER_TOKENS TOKENS
// where W x H is the decoded (displayed) size, ORIENTATION the EXIF value
// ProbeImage read, HEADER_TOKENS the count from ProbeImage + GridForImage
// (header only) and TOKENS the count GridForImage gives for the decoded size,
// both with the default Qwen2-VL PreprocessConfig; the pixels go to
// DIR/<basename of FILE>.rgb (W * H * 3 bytes, row-major RGB). Or:
//   FILE error CODE MESSAGE
// --resize W H: the pixels written are epd::ResizeRgb's W x H (BICUBIC, or
// BILINEAR with --bilinear) of the decoded image, and W H on the line are
// the resized size. --rows: also writes DIR/<basename>.f32, epd::Preprocess's
// patch rows (float32, row-major), and appends the grid T H W to the line
// (tests/python/test_resample_parity.py compares both with Pillow + numpy);
// with --dct-scaling those rows are DecodeAndPreprocess's with
// PreprocessConfig::jpeg_dct_scaling on.
// Exit status 0 when every file was processed (decode errors included), 2 on
// bad usage or an unreadable file.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "epd/media/image.h"
#include "epd/media/preprocess.h"

namespace {

int Usage(const char* why) {
  std::fprintf(stderr,
               "epd_decode_dump: %s\nusage: epd_decode_dump --out-dir DIR [--no-exif-orientation] "
               "[--rgba-background white|none|R,G,B] [--max-decode-pixels N] [--resize W H [--bilinear]] "
               "[--rows [--dct-scaling]] FILE...\n",
               why);
  return 2;
}

std::string OneLine(std::string s) {
  for (char& c : s) {
    if (c == '\n' || c == '\t') c = ' ';
  }
  return s;
}

bool WriteFile(const std::filesystem::path& path, const void* data, std::size_t size) {
  std::ofstream o(path, std::ios::binary);
  o.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!o) std::fprintf(stderr, "epd_decode_dump: cannot write %s\n", path.c_str());
  return static_cast<bool>(o);
}

// What to do with each file.
struct Options {
  epd::PreprocessConfig cfg;
  epd::DecodeLimits limits;
  std::filesystem::path out_dir;
  int resize_w = 0, resize_h = 0;
  epd::Resample filter = epd::Resample::kBicubic;
  bool rows = false;
};

// Writes FILE.f32 (Preprocess's rows) and returns "\tT\tH\tW", or the error.
epd::StatusOr<std::string> DumpRows(const std::string& file, std::span<const std::uint8_t> bytes,
                                    const epd::RgbImage& img, const Options& o, bool& io_ok) {
  // With --dct-scaling the rows are DecodeAndPreprocess's, which alone reads it.
  auto pre = o.cfg.jpeg_dct_scaling ? epd::DecodeAndPreprocess(bytes, o.cfg, o.limits) : epd::Preprocess(img, o.cfg);
  if (!pre.ok()) return pre.status();
  io_ok = WriteFile(o.out_dir / (std::filesystem::path(file).filename().string() + ".f32"), pre->patches.data(),
                    pre->patches.size() * sizeof(float));
  return "\t" + std::to_string(pre->grid.t) + "\t" + std::to_string(pre->grid.h) + "\t" + std::to_string(pre->grid.w);
}

// One FILE: its line on stdout and its files. False on an I/O failure.
bool DumpOne(const std::string& file, const Options& o) {
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "epd_decode_dump: cannot read %s\n", file.c_str());
    return false;
  }
  const std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto fail = [&](const epd::Status& s) {
    std::printf("%s\terror\t%s\t%s\n", file.c_str(), std::string(epd::StatusCodeName(s.code())).c_str(),
                OneLine(std::string(s.message())).c_str());
    return true;
  };
  auto info = epd::ProbeImage(bytes);
  if (!info.ok()) return fail(info.status());
  auto img = epd::DecodeImage(bytes, o.limits, o.cfg.decode);
  if (!img.ok()) return fail(img.status());
  auto header_grid = epd::GridForImage(*info, o.cfg);
  auto grid = epd::GridForImage(img->height, img->width, o.cfg);
  if (!header_grid.ok() || !grid.ok()) return fail(!grid.ok() ? grid.status() : header_grid.status());
  std::string grid_text;
  bool io_ok = true;
  if (o.rows) {
    auto text = DumpRows(file, bytes, *img, o, io_ok);
    if (!text.ok()) return fail(text.status());
    if (!io_ok) return false;
    grid_text = *text;
  }
  if (o.resize_w != 0 || o.resize_h != 0) {
    auto resized = epd::ResizeRgb(*img, o.resize_w, o.resize_h, o.filter);
    if (!resized.ok()) return fail(resized.status());
    *img = std::move(*resized);
  }
  if (!WriteFile(o.out_dir / (std::filesystem::path(file).filename().string() + ".rgb"), img->pixels.data(),
                 img->pixels.size())) {
    return false;
  }
  std::printf("%s\tok\t%d\t%d\t%d\t%lld\t%lld%s\n", file.c_str(), img->width, img->height, info->orientation,
              static_cast<long long>(header_grid->tokens(o.cfg.merge_size)),
              static_cast<long long>(grid->tokens(o.cfg.merge_size)), grid_text.c_str());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--out-dir" && has_value) {
      o.out_dir = argv[++i];
    } else if (arg == "--no-exif-orientation") {
      o.cfg.decode.apply_exif_orientation = false;
    } else if (arg == "--rgba-background" && has_value) {
      auto policy = epd::ParseAlphaPolicy(argv[++i]);
      if (!policy.ok()) return Usage(policy.status().message().c_str());
      o.cfg.decode.alpha = *policy;
    } else if (arg == "--max-decode-pixels" && has_value) {
      o.limits.max_pixels = std::strtoll(argv[++i], nullptr, 10);
    } else if (arg == "--resize" && i + 2 < argc) {
      o.resize_w = std::atoi(argv[++i]);
      o.resize_h = std::atoi(argv[++i]);
    } else if (arg == "--bilinear") {
      o.filter = epd::Resample::kBilinear;
    } else if (arg == "--rows") {
      o.rows = true;
    } else if (arg == "--dct-scaling") {
      o.cfg.jpeg_dct_scaling = true;
    } else if (!arg.empty() && arg[0] == '-') {
      return Usage(("unknown or incomplete option " + std::string(arg)).c_str());
    } else {
      files.emplace_back(arg);
    }
  }
  if (o.out_dir.empty() || files.empty()) return Usage("need --out-dir and at least one FILE");
  for (const std::string& file : files) {
    if (!DumpOne(file, o)) return 2;
  }
  return 0;
}
