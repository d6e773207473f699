// The L3 value codec (epd/l3/l3_value.h). Every field is written and read at a
// fixed offset through PutLe/GetLe, so the format does not depend on the
// host's struct layout or byte order. Decoding checks cheap fields first
// (sizes, magic, versions, shape) and the checksum last, so a value from
// another format version is named as such rather than as a bad checksum.
#include "epd/l3/l3_value.h"

#include <xxhash.h>

#include <cstring>
#include <limits>
#include <memory>

namespace epd {
namespace {

constexpr char kMagic[4] = {'E', 'P', 'L', '3'};
constexpr std::size_t kOffFormat = 4, kOffHeaderBytes = 6, kOffKeyVersion = 8, kOffDType = 12, kOffTokens = 16,
                      kOffHidden = 24, kOffDeepstack = 32, kOffGrid = 40, kOffPayload = 64, kOffKey = 72,
                      kOffChecksum = 104;
static_assert(kOffChecksum + 8 == kL3HeaderBytes);

void PutLe(std::uint64_t v, std::size_t n, char* out) {
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
std::uint64_t GetLe(const char* in, std::size_t n) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < n; ++i) v |= std::uint64_t{static_cast<unsigned char>(in[i])} << (8 * i);
  return v;
}

// XXH3-64 over the header's first kOffChecksum bytes, then the payload.
std::uint64_t Checksum(const char* header, const char* payload, std::size_t payload_bytes) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  XXH3_64bits_update(state, header, kOffChecksum);
  XXH3_64bits_update(state, payload, payload_bytes);
  const std::uint64_t h = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return h;
}

Status Corrupt(const std::string& what) { return Status(StatusCode::kDataLoss, "L3 value rejected: " + what); }

}  // namespace

std::string EncodeL3Value(const ContentKey& key, const Embedding& e, std::uint32_t key_version) {
  const std::size_t payload = e.main.size() + e.deepstack.size();
  std::string out(kL3HeaderBytes + payload, '\0');
  char* h = out.data();
  std::memcpy(h, kMagic, 4);
  PutLe(kL3FormatVersion, 2, h + kOffFormat);
  PutLe(kL3HeaderBytes, 2, h + kOffHeaderBytes);
  PutLe(key_version, 4, h + kOffKeyVersion);
  PutLe(static_cast<std::uint8_t>(e.dtype), 1, h + kOffDType);
  PutLe(static_cast<std::uint64_t>(e.tokens), 8, h + kOffTokens);
  PutLe(static_cast<std::uint64_t>(e.hidden), 8, h + kOffHidden);
  PutLe(static_cast<std::uint64_t>(e.deepstack_layers), 8, h + kOffDeepstack);
  PutLe(static_cast<std::uint64_t>(e.grid.t), 8, h + kOffGrid);
  PutLe(static_cast<std::uint64_t>(e.grid.h), 8, h + kOffGrid + 8);
  PutLe(static_cast<std::uint64_t>(e.grid.w), 8, h + kOffGrid + 16);
  PutLe(payload, 8, h + kOffPayload);
  std::memcpy(h + kOffKey, key.bytes.data(), key.bytes.size());
  char* rows = h + kL3HeaderBytes;
  if (!e.main.empty()) std::memcpy(rows, e.main.data(), e.main.size());
  if (!e.deepstack.empty()) std::memcpy(rows + e.main.size(), e.deepstack.data(), e.deepstack.size());
  PutLe(Checksum(h, rows, payload), 8, h + kOffChecksum);
  return out;
}

StatusOr<EmbeddingPtr> DecodeL3Value(std::string_view value, const ContentKey& key, std::uint32_t key_version) {
  if (value.size() < kL3HeaderBytes) {
    return Corrupt(std::to_string(value.size()) + " bytes, shorter than the " + std::to_string(kL3HeaderBytes) +
                   "-byte header");
  }
  const char* h = value.data();
  if (std::memcmp(h, kMagic, 4) != 0) return Corrupt("bad magic (not an epd L3 value)");
  if (const std::uint64_t f = GetLe(h + kOffFormat, 2); f != kL3FormatVersion) {
    return Corrupt("format version " + std::to_string(f) + ", this build reads " + std::to_string(kL3FormatVersion));
  }
  if (const std::uint64_t n = GetLe(h + kOffHeaderBytes, 2); n != kL3HeaderBytes) {
    return Corrupt("header of " + std::to_string(n) + " bytes, expected " + std::to_string(kL3HeaderBytes));
  }
  if (const std::uint64_t v = GetLe(h + kOffKeyVersion, 4); v != key_version) {
    return Corrupt("content key version " + std::to_string(v) + ", this build uses " + std::to_string(key_version));
  }
  const std::uint64_t dtype = GetLe(h + kOffDType, 1);
  if (dtype > static_cast<std::uint8_t>(DType::kFloat16) || GetLe(h + kOffDType + 1, 3) != 0) {
    return Corrupt("unknown dtype " + std::to_string(dtype));
  }
  auto e = std::make_shared<Embedding>();
  e->dtype = static_cast<DType>(dtype);
  e->tokens = static_cast<std::int64_t>(GetLe(h + kOffTokens, 8));
  e->hidden = static_cast<std::int64_t>(GetLe(h + kOffHidden, 8));
  e->deepstack_layers = static_cast<std::int64_t>(GetLe(h + kOffDeepstack, 8));
  e->grid.t = static_cast<std::int64_t>(GetLe(h + kOffGrid, 8));
  e->grid.h = static_cast<std::int64_t>(GetLe(h + kOffGrid + 8, 8));
  e->grid.w = static_cast<std::int64_t>(GetLe(h + kOffGrid + 16, 8));
  // Bounded so the byte count below cannot overflow: 2^24 rows or columns,
  // 2^10 deepstack layers are far beyond any vision tower.
  if (e->tokens < 0 || e->hidden < 0 || e->deepstack_layers < 0 || e->tokens > (1 << 24) || e->hidden > (1 << 24) ||
      e->deepstack_layers > (1 << 10) || e->grid.t < 0 || e->grid.h < 0 || e->grid.w < 0) {
    return Corrupt("shape out of range (tokens " + std::to_string(e->tokens) + ", hidden " + std::to_string(e->hidden) +
                   ", deepstack layers " + std::to_string(e->deepstack_layers) + ")");
  }
  const std::uint64_t payload = GetLe(h + kOffPayload, 8);
  if (payload != e->ExpectedBytes()) {
    return Corrupt("payload of " + std::to_string(payload) + " bytes, but the shape needs " +
                   std::to_string(e->ExpectedBytes()));
  }
  if (value.size() - kL3HeaderBytes != payload) {
    return Corrupt("value of " + std::to_string(value.size()) + " bytes, header says " +
                   std::to_string(kL3HeaderBytes + payload) + " (truncated or padded)");
  }
  if (std::memcmp(h + kOffKey, key.bytes.data(), key.bytes.size()) != 0) {
    return Corrupt("stored for another content key");
  }
  const char* rows = h + kL3HeaderBytes;
  if (GetLe(h + kOffChecksum, 8) != Checksum(h, rows, payload)) return Corrupt("checksum mismatch");
  const std::size_t main_bytes = e->main_bytes();
  const auto* p = reinterpret_cast<const std::byte*>(rows);
  e->main.assign(p, p + main_bytes);
  e->deepstack.assign(p + main_bytes, p + payload);
  return EmbeddingPtr(std::move(e));
}

}  // namespace epd
