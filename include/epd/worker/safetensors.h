// epd/worker/safetensors.h: embeddings written to and read from a safetensors file.
//
// safetensors (https://github.com/huggingface/safetensors, format section of
// its README) is a flat container: an 8-byte little-endian unsigned header
// length N, N bytes of a UTF-8 JSON header, then the tensor bytes. The header
// maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]},
// offsets relative to the first byte after the header, plus an optional
// "__metadata__" object whose values are all strings. numpy, torch and the
// `safetensors` package read it without epd-encode.
//
// Layout written here, for each distinct content key K (hex, 64 characters):
//   "<K>"            dtype  shape [tokens, hidden]                     main half
//   "<K>.deepstack"  dtype  shape [tokens, hidden * deepstack_layers]  only when
//                                                                      deepstack_layers > 0
//   "<K>.grid_thw"   I64    shape [3]                                  [t, h, w], only when
//                                                                      the grid is known
// dtype is "F32", "BF16" or "F16" (Embedding::dtype), bytes little-endian and
// row-major, exactly Embedding::main / Embedding::deepstack. "<K>.grid_thw"
// is Embedding::grid (epd/core/grid.h), the patch grid Qwen-VL prefill builds its
// M-RoPE positions from; stacking the rows of several keys gives Hugging
// Face's `image_grid_thw` [images, 3] int64. Why a tensor and not
// "__metadata__": a reader gets it from the same load call as the embedding
// (safetensors.numpy.load_file(...)[K + ".grid_thw"]), already an integer
// array, with no string to parse. Tensors are laid out in ascending key
// order, main, deepstack, grid, without gaps; the header is padded with spaces
// so the data starts 8-byte aligned (a grid may then sit at an offset that is
// not a multiple of 8). The same entries and metadata always give the same
// bytes.
//
// Errors: kInvalidArgument for an entry whose byte size disagrees with its
// shape, a null embedding, or a malformed file (each message names what is
// wrong); kUnavailable when the file cannot be opened, written or read.
// Duplicate keys are written once (the first entry wins); two different
// embeddings under one key are kInvalidArgument.
//
// Complexity: O(total bytes); the writer streams tensors without a second copy.
// Thread safety: the functions are thread-safe (no shared state).
//
// Example:
//   std::vector<epd::KeyedEmbedding> out = {{key, embedding}};
//   epd::Status s = epd::WriteEmbeddingsSafetensors("emb.safetensors", out, {{"model_id", "m"}});
//   auto back = epd::ReadEmbeddingsSafetensors("emb.safetensors");  // same keys, same bytes
#pragma once

#include <map>
#include <span>
#include <string>
#include <vector>

#include "epd/core/content_key_type.h"
#include "epd/core/embedding.h"
#include "epd/core/status.h"

namespace epd {

struct KeyedEmbedding {
  ContentKey key;
  EmbeddingPtr embedding;
};

// What ReadEmbeddingsSafetensors hands back: the embeddings in ascending key
// order and the "__metadata__" strings.
struct SafetensorsContents {
  std::vector<KeyedEmbedding> embeddings;
  std::map<std::string, std::string> metadata;
};

// Encodes `entries` (any order; duplicates as described above) into the
// bytes of a safetensors file.
StatusOr<std::string> SerializeEmbeddingsSafetensors(std::span<const KeyedEmbedding> entries,
                                                     const std::map<std::string, std::string>& metadata = {});

// Writes SerializeEmbeddingsSafetensors' bytes to `path` via a temporary file
// and a rename, so a reader never sees a half-written file.
Status WriteEmbeddingsSafetensors(const std::string& path, std::span<const KeyedEmbedding> entries,
                                  const std::map<std::string, std::string>& metadata = {});

// Parses bytes in the layout above. Tensors whose names are not a 64-digit
// hex key (optionally with ".deepstack" or ".grid_thw") are rejected with
// kInvalidArgument, as is a grid that is not I64 [3] of positive values or
// has no main tensor. A key without ".grid_thw" (a file written before grids
// were recorded) reads back with grid {0, 0, 0}.
StatusOr<SafetensorsContents> ParseEmbeddingsSafetensors(std::string_view bytes);
StatusOr<SafetensorsContents> ReadEmbeddingsSafetensors(const std::string& path);

}  // namespace epd
