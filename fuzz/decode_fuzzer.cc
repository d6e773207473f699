// libFuzzer entry point for the untrusted-input path: bytes -> key, probe,
// decode, preprocess. Beyond "no crash, no sanitizer report" it checks the
// invariants the rest of the system relies on, and aborts if one breaks:
//   - every failure is kInvalidArgument (bad input is the caller's error);
//   - a decodable image also probes, with the same size;
//   - GridForImage from the probed header equals the grid Preprocess made
//     (the scheduler budgets tokens from the header alone), EXIF orientation
//     included;
//   - decoding without orientation and with alpha dropped also succeeds, at
//     the stored size the header gave;
//   - the patch buffer holds exactly grid.patches() * patch_dim floats.
// The same function is linked into decode_corpus_replay (any compiler), so
// `ctest` replays fuzz/corpus on every build.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>

#include "epd/media/content_key.h"
#include "epd/media/image.h"
#include "epd/media/preprocess.h"

namespace {

[[noreturn]] void Violated(const char* what, const epd::Status& s) {
  std::fprintf(stderr, "decode_fuzzer: invariant violated: %s (%s)\n", what, s.ToString().c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> bytes(data, size);
  epd::PreprocessConfig cfg;
  cfg.max_pixels = std::int64_t{28} * 28 * 64;  // small targets keep iterations fast
  const epd::DecodeLimits limits{.max_pixels = 1 << 18};

  // Keys accept any bytes.
  (void)epd::ComputeContentKey("fuzz", cfg, bytes);
  (void)epd::ComputeContentKey("fuzz", cfg, bytes, epd::KeyMode::kXxh3Fast);

  auto info = epd::ProbeImage(bytes);
  if (!info.ok() && info.status().code() != epd::StatusCode::kInvalidArgument) {
    Violated("ProbeImage failed with a code other than INVALID_ARGUMENT", info.status());
  }
  auto pre = epd::DecodeAndPreprocess(bytes, cfg, limits);
  if (!pre.ok()) {
    if (pre.status().code() != epd::StatusCode::kInvalidArgument) {
      Violated("DecodeAndPreprocess failed with a code other than INVALID_ARGUMENT", pre.status());
    }
    return 0;
  }
  if (!info.ok()) Violated("decodable image does not probe", info.status());
  auto grid = epd::GridForImage(*info, cfg);
  if (!grid.ok()) Violated("GridForImage failed on a decodable image", grid.status());
  if (!(*grid == pre->grid)) Violated("GridForImage disagrees with Preprocess", epd::Status::Ok());
  if (pre->patches.size() != static_cast<std::size_t>(pre->grid.patches() * pre->patch_dim)) {
    Violated("patch buffer size != patches * patch_dim", epd::Status::Ok());
  }
  const epd::DecodeOptions stored_options{.apply_exif_orientation = false, .alpha = {.composite = false}};
  auto stored = epd::DecodeImage(bytes, limits, stored_options);
  if (!stored.ok()) Violated("decodes with the default options but not without orientation", stored.status());
  if (stored->width != info->width || stored->height != info->height) {
    Violated("stored-orientation decode size differs from the header's", epd::Status::Ok());
  }
  return 0;
}
