// epd/l3/l3_value.h: the byte format of an embedding stored in the shared tier
// (L3): a fixed, versioned header, then the rows.
//
// Why a header of our own and not safetensors: the value must be checked
// before it is trusted (another build, a bit flip, a truncated write, a key
// stored under the wrong name), and the check must cost one pass over the
// bytes. The header names everything a hit is validated against, and a
// checksum covers header and rows.
//
// Layout (little-endian, kL3HeaderBytes = 112):
//   offset size field
//        0    4 magic "EPL3"
//        4    2 format version (kL3FormatVersion)
//        6    2 header bytes (112)
//        8    4 content key version (epd/media/content_key.h: kContentKeyVersion)
//       12    1 dtype (DType)
//       13    3 zero
//       16    8 tokens            (int64)
//       24    8 hidden            (int64)
//       32    8 deepstack layers  (int64)
//       40   24 grid t, h, w      (3 x int64)
//       64    8 payload bytes     (uint64) = tokens*hidden*(1+deepstack)*dtype size
//       72   32 the content key the value was stored under
//      104    8 checksum: XXH3-64 (seed 0) over bytes [0, 104) and the payload
//      112    - payload: main rows, then deepstack rows (epd/core/embedding.h)
// Size: kL3HeaderBytes + Embedding::nbytes().
//
// Complexity: both directions are one pass over the payload (copy + hash).
// Thread safety: thread-safe (pure functions).
//
// Example:
//   std::string v = EncodeL3Value(key, *embedding, kContentKeyVersion);
//   StatusOr<EmbeddingPtr> back = DecodeL3Value(v, key, kContentKeyVersion);
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "epd/core/content_key_type.h"
#include "epd/core/embedding.h"
#include "epd/core/status.h"

namespace epd {

inline constexpr std::uint16_t kL3FormatVersion = 1;
inline constexpr std::size_t kL3HeaderBytes = 112;

// The value for `key`. REQUIRES: embedding.on_host() (call ToHost first) and
// its byte count matches its shape.
std::string EncodeL3Value(const ContentKey& key, const Embedding& embedding, std::uint32_t key_version);

// Parses and checks a value read for `key`. kDataLoss naming the first
// mismatch: wrong magic, format version, header size or key version, an
// unknown dtype, a negative or overflowing shape, a payload length that
// disagrees with the shape or the value's size (truncated or padded), another
// content key, or a checksum mismatch. Returns a fresh host Embedding.
StatusOr<EmbeddingPtr> DecodeL3Value(std::string_view value, const ContentKey& key, std::uint32_t key_version);

}  // namespace epd
