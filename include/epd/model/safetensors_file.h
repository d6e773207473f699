// epd/model/safetensors_file.h: a memory-mapped reader of safetensors files that
// hold any named tensors (model weights).
//
// The format itself (element types, the header's parse and validation, the
// writer) is epd/safetensors/safetensors_codec.h, which this header includes;
// epd/worker/safetensors.h uses the same codec for our own embedding files
// (tensors named by content key). This reader serves model checkpoints: it
// maps the file read-only and hands out views of the tensors' bytes without
// copying them. Only the pages of the tensors a caller touches are ever read
// from disk, so opening a 4 GB language-model shard to take the vision
// tower's 300 MB out of it costs the header parse and nothing else.
//
// Open() validates, before returning, everything a truncated or hostile file
// can get wrong, and each message names the file once and, where there is
// one, the tensor:
//   kNotFound         the file does not exist
//   kUnavailable      it cannot be opened, stat'ed or mapped
//   kInvalidArgument  anything ParseSafetensors refuses (shorter than 8
//                     bytes; header length 0, over 100 MB or past the end;
//                     not a JSON object; a malformed entry; an unknown dtype;
//                     data_offsets that end before they begin, run past the
//                     end ("truncated?") or overlap another tensor's; a byte
//                     count that disagrees with dtype x shape; non-string
//                     metadata),
//                     as "safetensors file <path>: <what>".
//
// Ownership: a SafetensorsFile owns its mapping; every TensorView's bytes
// point into it and stay valid while the SafetensorsFile lives (hold the
// shared_ptr). Views are read-only.
//
// Complexity: Open is O(header size); no tensor byte is read.
// Thread safety: a SafetensorsFile is immutable after Open, so concurrent
// readers are safe.
//
// Example:
//   auto file = epd::SafetensorsFile::Open("model.safetensors");
//   if (!file.ok()) return file.status();
//   if (const epd::TensorView* w = (*file)->Find("visual.merger.mlp.0.weight")) {
//     // w->dtype == TensorDType::kBF16, w->shape == {5120, 5120}, w->bytes: 52 MB
//   }
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "epd/core/status.h"
#include "epd/safetensors/safetensors_codec.h"

namespace epd {

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

}  // namespace epd
