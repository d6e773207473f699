// epd_decode_dump (test tool): decodes images exactly as the encode path
// does and writes the RGB8 pixels out, so a test in another language can
// compare them with another decoder (tests/python/test_pillow_parity.py
// compares them with Pillow). Not installed; built with the media tests.
//
// Usage:
//   epd_decode_dump --out-dir DIR [--no-exif-orientation]
//                   [--rgba-background white|none|R,G,B]
//                   [--max-decode-pixels N] FILE...
// For each FILE, one tab-separated line on stdout:
//   FILE ok W H ORIENTATION HEADER_TOKENS TOKENS
// where W x H is the decoded (displayed) size, ORIENTATION the EXIF value
// ProbeImage read, HEADER_TOKENS the count from ProbeImage + GridForImage
// (header only) and TOKENS the count GridForImage gives for the decoded size,
// both with the default Qwen2-VL PreprocessConfig; the pixels go to
// DIR/<basename of FILE>.rgb (W * H * 3 bytes, row-major RGB). Or:
//   FILE error CODE MESSAGE
// Exit status 0 when every file was processed (decode errors included), 2 on
// bad usage or an unreadable file.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "epd/media/image.h"
#include "epd/media/preprocess.h"

namespace {

int Usage(const char* why) {
  std::fprintf(stderr,
               "epd_decode_dump: %s\nusage: epd_decode_dump --out-dir DIR [--no-exif-orientation] "
               "[--rgba-background white|none|R,G,B] [--max-decode-pixels N] FILE...\n",
               why);
  return 2;
}

std::string OneLine(std::string s) {
  for (char& c : s) {
    if (c == '\n' || c == '\t') c = ' ';
  }
  return s;
}

// What the command line asks for.
struct DumpArgs {
  epd::PreprocessConfig cfg;
  epd::DecodeLimits limits;
  std::filesystem::path out_dir;
  std::vector<std::string> files;
};

// The arguments into `d`; what is wrong with them for Usage, or "" when
// nothing is.
std::string ParseArgs(int argc, char** argv, DumpArgs* d) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--out-dir" && has_value) {
      d->out_dir = argv[++i];
    } else if (arg == "--no-exif-orientation") {
      d->cfg.decode.apply_exif_orientation = false;
    } else if (arg == "--rgba-background" && has_value) {
      auto policy = epd::ParseAlphaPolicy(argv[++i]);
      if (!policy.ok()) return policy.status().message();
      d->cfg.decode.alpha = *policy;
    } else if (arg == "--max-decode-pixels" && has_value) {
      d->limits.max_pixels = std::strtoll(argv[++i], nullptr, 10);
    } else if (!arg.empty() && arg[0] == '-') {
      return "unknown or incomplete option " + std::string(arg);
    } else {
      d->files.emplace_back(arg);
    }
  }
  if (d->out_dir.empty() || d->files.empty()) return "need --out-dir and at least one FILE";
  return "";
}

// One file's line on stdout, its pixels under --out-dir; a decode error is
// a line too. False, with the reason on stderr, when the file cannot be read
// or its pixels cannot be written.
bool DumpFile(const std::string& file, const DumpArgs& d) {
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
  auto img = epd::DecodeImage(bytes, d.limits, d.cfg.decode);
  if (!img.ok()) return fail(img.status());
  auto header_grid = epd::GridForImage(*info, d.cfg);
  auto grid = epd::GridForImage(img->height, img->width, d.cfg);
  if (!header_grid.ok() || !grid.ok()) return fail(!grid.ok() ? grid.status() : header_grid.status());
  const std::filesystem::path out = d.out_dir / (std::filesystem::path(file).filename().string() + ".rgb");
  std::ofstream o(out, std::ios::binary);
  o.write(reinterpret_cast<const char*>(img->pixels.data()), static_cast<std::streamsize>(img->pixels.size()));
  if (!o) {
    std::fprintf(stderr, "epd_decode_dump: cannot write %s\n", out.c_str());
    return false;
  }
  std::printf("%s\tok\t%d\t%d\t%d\t%lld\t%lld\n", file.c_str(), img->width, img->height, info->orientation,
              static_cast<long long>(header_grid->tokens(d.cfg.merge_size)),
              static_cast<long long>(grid->tokens(d.cfg.merge_size)));
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  DumpArgs d;
  if (const std::string why = ParseArgs(argc, argv, &d); !why.empty()) return Usage(why.c_str());
  for (const std::string& file : d.files) {
    if (!DumpFile(file, d)) return 2;
  }
  return 0;
}
