// PNG through libpng's regular (not simplified) API.
//
// Why not the simplified API (png_image_*): it always converts to sRGB using
// the file's gAMA/cHRM/sRGB/iCCP chunks, so a PNG tagged gamma 1.0 came out
// up to 72 levels off what Pillow returns; Pillow does no colour management
// at all. The regular API transforms only what we ask for, and we ask for no
// gamma handling: low-bit-depth gray is expanded, gray is replicated to RGB,
// palette indices are unpacked to a byte and looked up here (an index past
// PLTE maps to grey (i, i, i) as in Pillow's palette, where libpng would
// give black), and 16-bit samples are reduced here as Pillow's raw modes do
// (high byte, or for 16-bit gray a clip to 0..255, see image.h).
//
// Pillow's modes (PngImagePlugin._MODES, Pillow 9.4) decide the alpha
// policy: colour type 6 (8 and 16 bit) and 16-bit gray+alpha open as "RGBA"
// and are composited per AlphaPolicy; everything else with transparency
// (8-bit gray+alpha "LA", tRNS on palette, gray or RGB) keeps convert("RGB")'s
// behaviour of dropping it.
//
// Error handling: libpng reports errors by longjmp to the setjmp in the
// function that called it. The functions that call libpng (PngReader's
// members) hold no objects with destructors, so the longjmp skips none; the
// buffers they fill are allocated by their callers before the call.
#include <png.h>

#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "image_internal.h"

namespace epd::internal {
namespace {

constexpr std::uint8_t kPngSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
// Signature, IHDR length and type, 13 bytes of IHDR data, CRC.
constexpr std::size_t kPngHeaderBytes = 8 + 8 + 13 + 4;

// Reads IHDR by hand, before libpng: libpng folds "width is zero" into a
// generic "Invalid IHDR data", and we want the zero size named.
StatusOr<ImageInfo> ParsePngHeader(ByteSpan bytes) {
  if (bytes.size() < 8 || std::memcmp(bytes.data(), kPngSignature, 8) != 0) {
    return Corrupt("PNG", "bad 8-byte signature");
  }
  if (bytes.size() < kPngHeaderBytes) {
    return Corrupt(
        "PNG", std::to_string(bytes.size()) + " bytes, the IHDR header alone needs " + std::to_string(kPngHeaderBytes));
  }
  const std::uint8_t* ihdr = bytes.data() + 8;
  if (ReadBe32(ihdr) != 13 || std::memcmp(ihdr + 4, "IHDR", 4) != 0) {
    return Corrupt("PNG", "the first chunk is not a 13-byte IHDR");
  }
  const std::uint32_t width = ReadBe32(ihdr + 8);
  const std::uint32_t height = ReadBe32(ihdr + 12);
  if (width == 0 || height == 0) {
    return InvalidArgument("zero-sized image: the PNG header says " + Dims(width, height));
  }
  constexpr std::uint32_t kMax = std::numeric_limits<std::int32_t>::max();  // PNG spec limit
  if (width > kMax || height > kMax) {
    return Corrupt("PNG", "header size " + Dims(width, height) + " exceeds the PNG limit of 2^31-1");
  }
  return ImageInfo{ImageFormat::kPng, static_cast<int>(width), static_cast<int>(height), 1};
}

struct PngSource {
  const std::uint8_t* data;
  std::size_t size;
  std::size_t pos;
};

struct PngErrorState {
  std::jmp_buf jump;
  char message[256];
};

void ReadFromMemory(png_structp png, png_bytep out, png_size_t n) {
  auto* src = static_cast<PngSource*>(png_get_io_ptr(png));
  if (n > src->size - src->pos) png_error(png, "unexpected end of data (the file is truncated)");
  std::memcpy(out, src->data + src->pos, n);
  src->pos += n;
}

[[noreturn]] void OnError(png_structp png, png_const_charp msg) {
  auto* state = static_cast<PngErrorState*>(png_get_error_ptr(png));
  std::snprintf(state->message, sizeof(state->message), "%s", msg);
  std::longjmp(state->jump, 1);
}

void OnWarning(png_structp, png_const_charp) {}  // benign: Pillow decodes such files too

// The decoded layout after our transformations.
struct PngLayout {
  int width = 0;
  int height = 0;
  int color_type = 0;  // as stored (IHDR)
  int bit_depth = 0;   // as stored (IHDR)
  bool interlaced = false;
  int out_channels = 0;  // 1 (palette index), 3 or 4 after the transformations
  int out_depth = 0;     // 8 or 16 after the transformations
  std::size_t rowbytes = 0;
  // Palette images: PLTE, then (i, i, i) for the entries it lacks.
  std::uint8_t palette[256][3] = {};
};

class PngReader {
 public:
  explicit PngReader(ByteSpan bytes) : src_{bytes.data(), bytes.size(), 0} {
    state_.message[0] = '\0';
    png_ = png_create_read_struct(PNG_LIBPNG_VER_STRING, &state_, OnError, OnWarning);
    if (png_ != nullptr) info_ = png_create_info_struct(png_);
  }
  ~PngReader() { png_destroy_read_struct(&png_, info_ != nullptr ? &info_ : nullptr, nullptr); }
  PngReader(const PngReader&) = delete;
  PngReader& operator=(const PngReader&) = delete;

  Status Failed() const { return Corrupt("PNG", state_.message[0] != '\0' ? state_.message : "libpng failed"); }

  // Reads the chunks up to the first IDAT, sets up the transformations and
  // fills `layout`. False on error (see Failed()).
  bool ReadInfo(PngLayout* layout) {
    if (png_ == nullptr || info_ == nullptr) return false;
    if (setjmp(state_.jump) != 0) return false;
    png_set_read_fn(png_, &src_, ReadFromMemory);
    png_read_info(png_, info_);
    layout->width = static_cast<int>(png_get_image_width(png_, info_));
    layout->height = static_cast<int>(png_get_image_height(png_, info_));
    layout->color_type = png_get_color_type(png_, info_);
    layout->bit_depth = png_get_bit_depth(png_, info_);
    layout->interlaced = png_get_interlace_type(png_, info_) != PNG_INTERLACE_NONE;
    if (layout->color_type == PNG_COLOR_TYPE_PALETTE) {
      png_colorp plte = nullptr;
      int entries = 0;
      if (png_get_PLTE(png_, info_, &plte, &entries) == 0) entries = 0;
      for (int i = 0; i < 256; ++i) {
        const auto v = static_cast<std::uint8_t>(i);
        layout->palette[i][0] = i < entries ? plte[i].red : v;
        layout->palette[i][1] = i < entries ? plte[i].green : v;
        layout->palette[i][2] = i < entries ? plte[i].blue : v;
      }
      png_set_packing(png_);  // 1, 2 and 4-bit indices to one byte each
    }
    if (layout->color_type == PNG_COLOR_TYPE_GRAY && layout->bit_depth < 8) png_set_expand_gray_1_2_4_to_8(png_);
    if ((layout->color_type & PNG_COLOR_MASK_COLOR) == 0) png_set_gray_to_rgb(png_);
    if (layout->interlaced) png_set_interlace_handling(png_);
    png_read_update_info(png_, info_);
    layout->out_channels = png_get_channels(png_, info_);
    layout->out_depth = png_get_bit_depth(png_, info_);
    layout->rowbytes = png_get_rowbytes(png_, info_);
    return true;
  }

  // Reads the next row (non-interlaced images only) into `row`.
  bool ReadRow(std::uint8_t* row) {
    if (setjmp(state_.jump) != 0) return false;
    png_read_row(png_, row, nullptr);
    return true;
  }

  // Reads the whole (interlaced) image; rows[y] points at row y.
  bool ReadImage(std::uint8_t** rows) {
    if (setjmp(state_.jump) != 0) return false;
    png_read_image(png_, rows);
    return true;
  }

 private:
  PngSource src_;
  PngErrorState state_;
  png_structp png_ = nullptr;
  png_infop info_ = nullptr;
};

// One decoded row (out_channels samples of out_depth bits per pixel) to RGB8.
class RowConverter {
 public:
  RowConverter(const PngLayout& layout, const DecodeOptions& options)
      : width_(static_cast<std::size_t>(layout.width)),
        channels_(layout.out_channels),
        wide_(layout.out_depth == 16),
        // Pillow mode "I" (16-bit gray, no alpha): convert("RGB") clips.
        clip16_(layout.color_type == PNG_COLOR_TYPE_GRAY && layout.bit_depth == 16),
        composite_(layout.color_type == PNG_COLOR_TYPE_RGB_ALPHA ||
                   (layout.color_type == PNG_COLOR_TYPE_GRAY_ALPHA && layout.bit_depth == 16)),
        alpha_(options.alpha),
        palette_(layout.color_type == PNG_COLOR_TYPE_PALETTE ? layout.palette : nullptr) {}

  void Convert(const std::uint8_t* in, std::uint8_t* out) const {
    if (palette_ != nullptr) {  // tRNS is never applied: Pillow's mode "P" drops it
      for (std::size_t x = 0; x < width_; ++x) std::memcpy(out + 3 * x, palette_[in[x]], 3);
      return;
    }
    std::uint8_t px[4];
    for (std::size_t x = 0; x < width_; ++x) {
      for (int c = 0; c < channels_; ++c) {
        if (!wide_) {
          px[c] = in[x * channels_ + c];
        } else {
          const std::uint8_t* s = in + 2 * (x * channels_ + c);
          // Pillow's ";16B" raw modes keep the high byte; mode "I" clips.
          px[c] = clip16_ ? (s[0] != 0 ? 255 : s[1]) : s[0];
        }
      }
      if (channels_ == 4 && composite_ && alpha_.composite) {
        for (int c = 0; c < 3; ++c) out[3 * x + c] = BlendOver(px[c], px[3], alpha_.background[c]);
      } else {
        std::memcpy(out + 3 * x, px, 3);
      }
    }
  }

 private:
  std::size_t width_;
  int channels_;
  bool wide_;
  bool clip16_;
  bool composite_;
  AlphaPolicy alpha_;
  const std::uint8_t (*palette_)[3];  // into the PngLayout; null unless a palette image
};

}  // namespace

StatusOr<ImageInfo> ProbePng(ByteSpan bytes) {
  auto info = ParsePngHeader(bytes);
  if (!info.ok()) return info;
  PngReader reader(bytes);  // validates IHDR fields and chunk CRCs up to the first IDAT
  PngLayout layout;
  if (!reader.ReadInfo(&layout)) return reader.Failed();
  info->orientation = PngOrientation(bytes);
  return info;
}

StatusOr<RgbImage> DecodePng(ByteSpan bytes, const DecodeLimits& limits, const DecodeOptions& options) {
  auto info = ParsePngHeader(bytes);
  if (!info.ok()) return info.status();
  if (Status s = CheckPixelLimit(info->width, info->height, limits); !s.ok()) return s;

  PngReader reader(bytes);
  PngLayout layout;
  if (!reader.ReadInfo(&layout)) return reader.Failed();
  if (layout.width != info->width || layout.height != info->height ||
      (layout.color_type == PNG_COLOR_TYPE_PALETTE ? layout.out_channels != 1 || layout.out_depth != 8
                                                   : layout.out_channels != 3 && layout.out_channels != 4) ||
      (layout.out_depth != 8 && layout.out_depth != 16) ||
      layout.rowbytes != static_cast<std::size_t>(layout.width) * layout.out_channels * (layout.out_depth / 8)) {
    return Corrupt("PNG", "unexpected layout after libpng's transformations");
  }
  const RowConverter convert(layout, options);

  RgbImage img;
  img.width = layout.width;
  img.height = layout.height;
  const std::size_t out_row = static_cast<std::size_t>(img.width) * 3;
  img.pixels.resize(out_row * img.height);
  if (!layout.interlaced) {
    std::vector<std::uint8_t> row(layout.rowbytes);
    for (int y = 0; y < img.height; ++y) {
      if (!reader.ReadRow(row.data())) return reader.Failed();
      convert.Convert(row.data(), img.pixels.data() + y * out_row);
    }
    return img;
  }
  // Adam7 needs every pass before any row is final: read the whole image in
  // the transformed layout, then convert.
  std::vector<std::uint8_t> raw(layout.rowbytes * img.height);
  std::vector<std::uint8_t*> rows(img.height);
  for (int y = 0; y < img.height; ++y) rows[y] = raw.data() + y * layout.rowbytes;
  if (!reader.ReadImage(rows.data())) return reader.Failed();
  for (int y = 0; y < img.height; ++y) convert.Convert(rows[y], img.pixels.data() + y * out_row);
  return img;
}

}  // namespace epd::internal
