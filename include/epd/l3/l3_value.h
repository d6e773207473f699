// epd/l3/l3_value.h: the byte format of an embedding stored in the shared tier
// (L3): a fixed, versioned header, then the rows.
//
// Why a header of our own and not safetensors: the value must be checked
// before it is trusted (another build, a bit flip, a truncated write, a key
// stored under the wrong name, a forgery), and the check must cost one pass
// over the bytes. The header names everything a hit is validated against.
//
// Two formats. Which one a process writes and reads depends only on whether
// it has a cluster keyring (L3ValueOptions::keyring, `--l3-key-file`):
//   format 1, no keyring: an XXH3-64 checksum covers header and rows. It
//     detects corruption, not forgery: anyone who can write to the Redis can
//     make every server serve rows of their choice.
//   format 2, keyring: a GMAC tag (AES-256-GCM, epd/l3/l3_mac.h) under the
//     cluster key covers header and rows, and the header names the key id.
//     There is no XXH3 checksum: any change the checksum would catch changes
//     the tag too (a forgery passes GMAC with probability about 2^-128 per
//     attempt, a random error no more often), and one pass fewer is spent on
//     the hit path. A keyed reader accepts nothing else (format 1 included).
//
// Layout (little-endian). Bytes [0, 104) are the same in both formats:
//   offset size field
//        0    4 magic "EPL3"
//        4    2 format version (1 or 2)
//        6    2 header bytes (kL3HeaderBytes = 112 or kL3KeyedHeaderBytes = 136)
//        8    4 content key version (epd/media/content_key.h: kContentKeyVersion)
//       12    1 dtype (DType)
//       13    1 merge size (format 2; zero in format 1, where the reader's is used)
//       14    2 zero
//       16    8 tokens            (int64)
//       24    8 hidden            (int64)
//       32    8 deepstack layers  (int64)
//       40   24 grid t, h, w      (3 x int64)
//       64    8 payload bytes     (uint64) = tokens*hidden*(1+deepstack)*dtype size
//       72   32 the content key the value was stored under
//   format 1:
//      104    8 checksum: XXH3-64 (seed 0) over bytes [0, 104) and the payload
//      112    - payload: main rows, then deepstack rows (epd/core/embedding.h)
//   format 2:
//      104    4 key id of the cluster key the tag is under (L3Keyring)
//      108   12 GMAC IV, random per value (RAND_bytes)
//      120   16 GMAC tag over bytes [0, 120) and the payload, under the key's
//               value key
//      136    - payload
// The optional encode cost (issue 26): a value written with a measured cost
// has a header 8 bytes longer (header bytes 120 in format 1, 144 in format
// 2), whose last 8 bytes are the cost in seconds (IEEE 754 binary64, finite,
// >= 0), just before the payload; the checksum or the tag covers them too
// (they are hashed after the fixed header fields, before the payload). A
// value without one keeps the header sizes above, byte for byte what the
// builds before the field wrote, and reads back as kL3Unmeasured. A reader
// older than the field refuses a costed value as a header size mismatch (and
// its tier deletes it), so a cluster upgrades its readers before any writer
// writes costs: docs/L3.md, "Encode cost".
// Size: header bytes + Embedding::nbytes().
//
// What a decoded value must satisfy besides its checksum or tag (issue 27,
// fault 3): a grid with t, h, w > 0 and tokens == t*h*w / merge^2 exactly,
// a merge size equal to the reader's (format 2), and finite rows (no NaN or
// Inf in any main or deepstack element, for float32, bfloat16 and float16
// alike), checked in the same pass as the tag or checksum and the copy.
//
// Complexity: both directions are one pass over the payload (copy + MAC or
// hash, + the finiteness check when decoding).
// Thread safety: thread-safe (pure functions; the keyring is immutable).
//
// Example:
//   L3ValueOptions o;  o.keyring = ring;  o.merge_size = 2;
//   std::string v = EncodeL3Value(key, *embedding, kContentKeyVersion, o);
//   StatusOr<EmbeddingPtr> back = DecodeL3Value(v, key, kContentKeyVersion, o);
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "epd/core/content_key_type.h"
#include "epd/core/embedding.h"
#include "epd/core/status.h"
#include "epd/l3/l3_keyring.h"

namespace epd {

inline constexpr std::uint16_t kL3FormatChecksummed = 1;
inline constexpr std::uint16_t kL3FormatAuthenticated = 2;
inline constexpr std::size_t kL3HeaderBytes = 112;             // format 1
inline constexpr std::size_t kL3KeyedHeaderBytes = 136;        // format 2
inline constexpr std::size_t kL3CostedHeaderBytes = 120;       // format 1 with the cost field
inline constexpr std::size_t kL3KeyedCostedHeaderBytes = 144;  // format 2 with the cost field
// A value that carries no encode cost (EntryCost::kUnmeasured's value).
inline constexpr double kL3Unmeasured = -1;

struct L3ValueOptions {
  // The cluster keyring. Null: format 1 is written and the only format read.
  // Set: format 2 under its current key is written; format 2 under its
  // current or previous key is the only format read.
  std::shared_ptr<const L3Keyring> keyring;
  // The reader's (and writer's) tower merge size, 1..64: a value's tokens
  // must be t*h*w / merge_size^2.
  std::int64_t merge_size = 2;
};

// The value for `key`, with the cost field when `encode_seconds` is finite
// and >= 0 (the seconds it took to encode; anything else writes none).
// REQUIRES: embedding.on_host() (call ToHost first) and its byte count
// matches its shape. Throws epd::Error(kInternal) only when OpenSSL fails (no
// random bytes for the IV, out of memory).
std::string EncodeL3Value(const ContentKey& key, const Embedding& embedding, std::uint32_t key_version,
                          const L3ValueOptions& options = {}, double encode_seconds = kL3Unmeasured);

// Parses and checks a value read for `key`; returns a fresh host Embedding.
// Errors, each naming the first failed check:
//   kUnauthenticated (only with a keyring): the value does not carry a valid
//     tag under a key the keyring holds: another format (format 1 included),
//     a key id that is unknown or was retired by a rotation, a tag mismatch
//     (forged or altered bytes), too short for a header.
//   kDataLoss: an authentic (or, without a keyring, checksummed) value that
//     fails a check: wrong magic, format version, header size or key
//     version, an unknown dtype, a negative or overflowing shape, a
//     degenerate grid or one whose tokens disagree with it, another merge
//     size, a payload length that disagrees with the shape or the value's
//     size (truncated or padded), another content key, a checksum mismatch,
//     non-finite rows, a negative or non-finite cost field. Without a
//     keyring, a format 2 value is kDataLoss too.
// `encode_seconds`, when set, receives the value's cost field on success
// (kL3Unmeasured when it has none).
StatusOr<EmbeddingPtr> DecodeL3Value(std::string_view value, const ContentKey& key, std::uint32_t key_version,
                                     const L3ValueOptions& options = {}, double* encode_seconds = nullptr);

}  // namespace epd
