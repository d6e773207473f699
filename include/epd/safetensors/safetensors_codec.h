// epd/safetensors/safetensors_codec.h: the safetensors format, once. Its
// element types, the parse and validation of a file's header, and the writer
// of a whole file. The checkpoint reader (epd/model/safetensors_file.h, which
// memory-maps model weights) and the embedding files (epd/worker/safetensors.h,
// tensors named by content key) both read and write through it.
//
// Format (https://github.com/huggingface/safetensors, README "Format"): an
// 8-byte little-endian unsigned header length N, N bytes of a UTF-8 JSON
// object mapping each tensor name to {"dtype", "shape", "data_offsets":
// [begin, end]} (byte offsets relative to the first byte after the header)
// plus an optional "__metadata__" object whose values are all strings, then
// the tensor bytes, little-endian and row-major. The writer pads the header
// with spaces to a multiple of 8 bytes, so the data starts 8-byte aligned,
// as the reference writer does.
//
// ParseSafetensors validates, before it hands out a single view, everything
// a truncated or hostile file can get wrong. Every error is kInvalidArgument
// and reads "<source>: <what>" (`source` names the file once, e.g.
// "safetensors file /m/model.safetensors"), with the tensor named where there
// is one:
//   - fewer than 8 bytes; a header length of 0, over 100 MB (the reference
//     reader's bound) or past the end of the bytes;
//   - a header that is not JSON, or not a JSON object;
//   - a tensor with an empty name (the writer refuses one too);
//   - an entry that is not an object, or lacks a string "dtype", an array
//     "shape" of non-negative integers or two non-negative "data_offsets";
//   - an unknown dtype; a shape whose element count overflows 64 bits;
//   - data_offsets that end before they begin, or past the end of the data
//     ("truncated?"); end - begin != element count x dtype size;
//   - two tensors whose (non-empty) data ranges overlap;
//   - a "__metadata__" that is not an object of strings.
// Gaps between data ranges, and bytes after the last one, are accepted: the
// reference writer leaves none, but they cannot make a read go out of bounds.
//
// Ownership: the views ParseSafetensors returns point into the caller's
// bytes and live as long as those do. SerializeSafetensors borrows its
// tensors' bytes for the call only.
// Complexity: ParseSafetensors is O(header size + tensors log tensors) and
// reads no tensor byte; SerializeSafetensors is O(total bytes), one copy.
// Thread safety: every function is thread-safe (no shared state).
//
// Example:
//   std::vector<epd::NamedTensor> t = {{"w", {epd::TensorDType::kF32, {2, 3}, bytes}}};
//   epd::StatusOr<std::string> file = epd::SerializeSafetensors(t, {{"format", "pt"}});
//   auto parsed = epd::ParseSafetensors(std::as_bytes(std::span(*file)), "w.safetensors");
//   // parsed->tensors.at("w").shape == {2, 3}; parsed->metadata.at("format") == "pt"
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "epd/core/embedding.h"
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
// An embedding's element type (epd/core/embedding.h: F32, BF16 or F16) as a
// tensor's, and back; nullopt for a tensor type no embedding has.
TensorDType ToTensorDType(DType dtype);
std::optional<DType> ToEmbeddingDType(TensorDType dtype);

// One tensor: of a parsed file (bytes point into it), or to write (bytes
// borrowed from the caller).
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

// What ParseSafetensors found in a file's bytes.
struct ParsedSafetensors {
  std::string_view header;                                 // the N header bytes (trailing padding included)
  std::map<std::string, TensorView, std::less<>> tensors;  // by name, ascending
  std::map<std::string, std::string> metadata;             // "__metadata__"
};

// Parses and validates the whole file `bytes` (see the header comment for
// the errors; each message starts with `source`).
StatusOr<ParsedSafetensors> ParseSafetensors(std::span<const std::byte> bytes, std::string_view source);

// A tensor to write. `tensor.bytes` is borrowed for the call.
struct NamedTensor {
  std::string name;
  TensorView tensor;
};

// The bytes of a safetensors file holding `tensors` and `metadata`: tensors
// in ascending name order, their data without gaps in the same order, the
// header padded with spaces to a multiple of 8. The same tensors and
// metadata, in any order, always give the same bytes. Errors
// (kInvalidArgument, naming the tensor): an empty or duplicate name, the
// name "__metadata__", a negative dimension, or bytes.size() != element
// count x dtype size.
StatusOr<std::string> SerializeSafetensors(std::span<const NamedTensor> tensors,
                                           const std::map<std::string, std::string>& metadata = {});

// Writes `bytes` to `path` through `path`.tmp and a rename, so a reader never
// sees a half-written file; the temporary is removed on failure.
// kUnavailable, naming the file, when it cannot be written or renamed.
Status WriteFileAtomically(const std::string& path, std::string_view bytes);

// SerializeSafetensors, written with WriteFileAtomically.
Status WriteSafetensors(const std::string& path, std::span<const NamedTensor> tensors,
                        const std::map<std::string, std::string>& metadata = {});

}  // namespace epd
