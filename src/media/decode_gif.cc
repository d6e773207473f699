// GIF through giflib's low-level reader: only the first frame is read, so an
// animation costs one frame's decode, not all of them (DGifSlurp would
// decode every frame).
//
// Pillow 9.4's first frame (GifImagePlugin._seek(0) and load_prepare):
//   - size: the logical screen, grown to hold the first frame's rectangle;
//   - the canvas is filled with the frame's transparent index when a Graphic
//     Control Extension before the frame sets one, else with index 0, and
//     the frame's pixels (the transparent index included) are written at its
//     offset;
//   - palette: the frame's local colour table, else the global one. A table
//     that is the identity grey ramp (entry i == (i, i, i)) is "not needed":
//     the frame is mode "L" and a pixel's value is its index; a local table
//     that is a ramp also hides the global one. Otherwise mode "P", and an
//     index past the table's end maps to (i, i, i), as Pillow's palette does;
//   - mode "P" or "L", never "RGBA", so transparency is always dropped
//     (convert("RGB") keeps the transparent entry's colour), whatever the
//     alpha policy.
#include <gif_lib.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "image_internal.h"

namespace epd::internal {
namespace {

struct GifSource {
  const std::uint8_t* data;
  std::size_t size;
  std::size_t pos;
};

int ReadFromMemory(GifFileType* gif, GifByteType* out, int n) {
  auto* src = static_cast<GifSource*>(gif->UserData);
  const std::size_t want = n < 0 ? 0 : static_cast<std::size_t>(n);
  const std::size_t got = std::min(want, src->size - src->pos);
  std::memcpy(out, src->data + src->pos, got);
  src->pos += got;
  return static_cast<int>(got);
}

struct GifCloser {
  void operator()(GifFileType* gif) const {
    int error = 0;
    DGifCloseFile(gif, &error);
  }
};
using GifHandle = std::unique_ptr<GifFileType, GifCloser>;

Status GifError(int code) {
  const char* why = GifErrorString(code);
  return Corrupt("GIF", why != nullptr ? why : ("giflib error " + std::to_string(code)).c_str());
}

// What Pillow knows once it has seeked to frame 0.
struct FirstFrame {
  int width = 0;  // canvas (screen grown to the frame)
  int height = 0;
  int x0 = 0, y0 = 0, fw = 0, fh = 0;
  bool interlaced = false;
  int transparency = -1;  // index, or -1
  // The effective palette: empty for mode "L" (pixel value = index).
  std::vector<std::array<std::uint8_t, 3>> palette;
};

bool PaletteNeeded(const ColorMapObject* map) {
  for (int i = 0; i < map->ColorCount; ++i) {
    const GifColorType& c = map->Colors[i];
    if (!(c.Red == i && c.Green == i && c.Blue == i)) return true;
  }
  return false;
}

// Opens the GIF and reads records up to and including the first image
// descriptor; the frame's pixel data is next.
StatusOr<GifHandle> OpenToFirstFrame(GifSource* src, FirstFrame* out) {
  int error = 0;
  GifHandle gif(DGifOpen(src, ReadFromMemory, &error));
  if (!gif) return GifError(error);
  for (;;) {
    GifRecordType type;
    if (DGifGetRecordType(gif.get(), &type) == GIF_ERROR) return GifError(gif->Error);
    if (type == TERMINATE_RECORD_TYPE) return Corrupt("GIF", "no image in the file");
    if (type == EXTENSION_RECORD_TYPE) {
      int code = 0;
      GifByteType* block = nullptr;
      if (DGifGetExtension(gif.get(), &code, &block) == GIF_ERROR) return GifError(gif->Error);
      // Graphic Control Extension: block[0] is the length, then flags,
      // delay (2 bytes), transparent index. Pillow only ever sets it.
      if (code == GRAPHICS_EXT_FUNC_CODE && block != nullptr && block[0] >= 4 && (block[1] & 1) != 0) {
        out->transparency = block[4];
      }
      while (block != nullptr) {
        if (DGifGetExtensionNext(gif.get(), &block) == GIF_ERROR) return GifError(gif->Error);
      }
      continue;
    }
    if (type != IMAGE_DESC_RECORD_TYPE) continue;  // UNDEFINED_RECORD_TYPE: skipped, as Pillow skips
    if (DGifGetImageDesc(gif.get()) == GIF_ERROR) return GifError(gif->Error);
    const GifImageDesc& d = gif->Image;
    out->x0 = d.Left;
    out->y0 = d.Top;
    out->fw = d.Width;
    out->fh = d.Height;
    out->interlaced = d.Interlace;
    out->width = std::max<int>(gif->SWidth, d.Left + d.Width);
    out->height = std::max<int>(gif->SHeight, d.Top + d.Height);
    if (out->width <= 0 || out->height <= 0 || d.Left < 0 || d.Top < 0 || d.Width < 0 || d.Height < 0) {
      return InvalidArgument("zero-sized image: the GIF screen and first frame are " + Dims(out->width, out->height));
    }
    const ColorMapObject* map = nullptr;
    if (d.ColorMap != nullptr) {
      if (PaletteNeeded(d.ColorMap)) map = d.ColorMap;
    } else if (gif->SColorMap != nullptr && PaletteNeeded(gif->SColorMap)) {
      map = gif->SColorMap;
    }
    if (map != nullptr) {
      out->palette.resize(256);
      for (int i = 0; i < 256; ++i) {
        const auto v = static_cast<std::uint8_t>(i);
        out->palette[i] = i < map->ColorCount ? std::array<std::uint8_t, 3>{map->Colors[i].Red, map->Colors[i].Green,
                                                                            map->Colors[i].Blue}
                                              : std::array<std::uint8_t, 3>{v, v, v};
      }
    }
    return gif;
  }
}

}  // namespace

StatusOr<ImageInfo> ProbeGif(ByteSpan bytes) {
  GifSource src{bytes.data(), bytes.size(), 0};
  FirstFrame frame;
  auto gif = OpenToFirstFrame(&src, &frame);
  if (!gif.ok()) return gif.status();
  return ImageInfo{ImageFormat::kGif, frame.width, frame.height, 1};
}

StatusOr<RgbImage> DecodeGif(ByteSpan bytes, const DecodeLimits& limits, const DecodeOptions& /*options*/) {
  GifSource src{bytes.data(), bytes.size(), 0};
  FirstFrame frame;
  auto gif = OpenToFirstFrame(&src, &frame);
  if (!gif.ok()) return gif.status();
  if (Status s = CheckPixelLimit(frame.width, frame.height, limits); !s.ok()) return s;

  const std::size_t w = static_cast<std::size_t>(frame.width);
  const std::size_t npix = w * static_cast<std::size_t>(frame.height);
  // Indices first (1 B/px), expanded to RGB in place from the end.
  std::vector<std::uint8_t> px(npix * 3, static_cast<std::uint8_t>(frame.transparency >= 0 ? frame.transparency : 0));
  if (frame.fw > 0 && frame.fh > 0) {
    std::vector<GifPixelType> line(static_cast<std::size_t>(frame.fw));
    // Row order: 0..h-1, or the four interlace passes.
    static constexpr int kStart[4] = {0, 4, 2, 1};
    static constexpr int kStep[4] = {8, 8, 4, 2};
    const int passes = frame.interlaced ? 4 : 1;
    for (int pass = 0; pass < passes; ++pass) {
      const int start = frame.interlaced ? kStart[pass] : 0;
      const int step = frame.interlaced ? kStep[pass] : 1;
      for (int y = start; y < frame.fh; y += step) {
        if (DGifGetLine(gif->get(), line.data(), frame.fw) == GIF_ERROR) return GifError((*gif)->Error);
        std::memcpy(&px[(std::size_t(frame.y0) + y) * w + std::size_t(frame.x0)], line.data(), line.size());
      }
    }
  }
  for (std::size_t i = npix; i-- > 0;) {  // backwards: index i is read before 3i.. are written
    const std::uint8_t index = px[i];
    if (frame.palette.empty()) {
      px[3 * i] = px[3 * i + 1] = px[3 * i + 2] = index;
    } else {
      std::memcpy(&px[3 * i], frame.palette[index].data(), 3);
    }
  }
  return RgbImage{frame.width, frame.height, std::move(px)};
}

}  // namespace epd::internal
