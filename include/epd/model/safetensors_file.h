// epd/model/safetensors_file.h: a memory-mapped reader of safetensors files that
// hold any named tensors (model weights), and a small writer for the same.
//
// Where epd/worker/safetensors.h reads and writes our own embedding files (tensors
// named by content key), this reader serves model checkpoints: it maps the
// file read-only and hands out views of the tensors' bytes without copying
// them. Only the pages of the tensors a caller touches are ever read from
// disk, so opening a 4 GB language-model shard to take the vision tower's
// 300 MB out of it costs the header parse and nothing else.
//
// Format (https://github.com/huggingface/safetensors, README "Format"): an
// 8-byte little-endian header length N, N bytes of a UTF-8 JSON object
// mapping each tensor name to {"dtype", "shape", "data_offsets": [begin,
// end]} (offsets relative to the first byte after the header) plus an
// optional "__metadata__" object of strings, then the tensor bytes,
// little-endian and row-major.
//
// Open() validates, before returning, everything a truncated or hostile file
// can get wrong, and each message names the file and, where there is one, the
// tensor:
//   kNotFound         the file does not exist
//   kUnavailable      it cannot be opened, stat'ed or mapped
//   kInvalidArgument  shorter than 8 bytes; header length 0, over 100 MB, or
//                     past the end of the file; header not a JSON object;
//                     an entry without a string dtype, an array shape of
//                     non-negative integers or two data_offsets; an unknown
//                     dtype; begin > end; end past the end of the file
//                     ("truncated?"); end - begin != numel * dtype size;
//                     a __metadata__ value that is not a string.
// Overlapping or gapped data ranges are accepted (the format forbids them,
// but they cannot make a read go out of bounds).
//
// Ownership: a SafetensorsFile owns its mapping; every TensorView's bytes
// point into it and stay valid while the SafetensorsFile lives (hold the
// shared_ptr). Views are read-only.
//
// Complexity: Open is O(header size); no tensor byte is read.
// Thread safety: a SafetensorsFile is immutable after Open, so concurrent
// readers are safe. The free functions are thread-safe.
//
// Example:
//   auto file = epd::SafetensorsFile::Open("model.safetensors");
//   if (!file.ok()) return file.status();
//   if (const epd::TensorView* w = (*file)->Find("visual.merger.mlp.0.weight")) {
//     // w->dtype == TensorDType::kBF16, w->shape == {5120, 5120}, w->bytes: 52 MB
//   }
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "epd/core/status.h"

namespace epd {

// The safetensors element types (the format's full list).
enum class TensorDType : std::uint8_t {
  kBool,
  kU8,
  kI8,
  kF8E5M2,
  kF8E4M3,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kF64,
  kI64,
  kU64,
};

// The format's spelling: "BOOL", "U8", ..., "F8_E4M3", "BF16", "F32", ...
std::string_view TensorDTypeName(TensorDType dtype);
// Bytes per element: 1, 2, 4 or 8.
std::size_t TensorDTypeSize(TensorDType dtype);
// The inverse of TensorDTypeName; nullopt for an unknown spelling.
std::optional<TensorDType> ParseTensorDType(std::string_view name);

// One tensor of a mapped file (or of a caller's buffer, for the writer).
struct TensorView {
  TensorDType dtype = TensorDType::kF32;
  std::vector<std::int64_t> shape;
  std::span<const std::byte> bytes;  // numel() * TensorDTypeSize(dtype) bytes

  std::int64_t numel() const {
    std::int64_t n = 1;
    for (std::int64_t d : shape) n *= d;
    return n;
  }
};

// "[3, 4]".
std::string ShapeToString(std::span<const std::int64_t> shape);

class SafetensorsFile {
 public:
  // Maps and validates `path`; see the header comment for the errors.
  static StatusOr<std::shared_ptr<const SafetensorsFile>> Open(const std::string& path);

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  std::uint64_t file_size() const { return size_; }
  // The raw JSON header (N bytes, trailing padding included).
  std::string_view header() const;
  // Every tensor, by name (ascending).
  const std::map<std::string, TensorView, std::less<>>& tensors() const { return tensors_; }
  // The tensor called `name`, or null.
  const TensorView* Find(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;

  std::string path_;
  const std::byte* base_ = nullptr;  // the mapping, size_ bytes
  std::uint64_t size_ = 0;
  std::uint64_t header_bytes_ = 0;
  std::map<std::string, TensorView, std::less<>> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A tensor to write. `bytes` is borrowed for the call.
struct NamedTensor {
  std::string name;
  TensorView tensor;
};

// The bytes of a safetensors file holding `tensors` (in ascending name order,
// without gaps, the header padded with spaces to a multiple of 8) and
// `metadata`. Errors (kInvalidArgument): a duplicate or empty name, the name
// "__metadata__", a negative dimension, or bytes.size() != numel * dtype size.
StatusOr<std::string> SerializeSafetensors(std::span<const NamedTensor> tensors,
                                           const std::map<std::string, std::string>& metadata = {});

// SerializeSafetensors, written to `path` via a temporary file and a rename.
// Errors: as SerializeSafetensors, or kUnavailable when the file cannot be written.
Status WriteSafetensors(const std::string& path, std::span<const NamedTensor> tensors,
                        const std::map<std::string, std::string>& metadata = {});

}  // namespace epd
