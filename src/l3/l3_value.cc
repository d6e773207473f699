// The L3 value codec (epd/l3/l3_value.h). Every field is written and read at a
// fixed offset through PutLe/GetLe, so the format does not depend on the
// host's struct layout or byte order. Decoding checks cheap fields first
// (sizes, magic, versions, shape) and the checksum or tag in one pass with
// the copy and the finiteness check (RowScan), so a value from another
// format version is named as such rather than as a bad checksum.
//
// A keyed reader decides authenticity before anything else it reports: a
// value whose header fails a check is reported as kUnauthenticated when its
// tag does not match either (a forgery with a bad header), and as kDataLoss
// only when the tag matches (a key holder wrote a bad value).
#include "epd/l3/l3_value.h"

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

namespace epd {
namespace {

constexpr char kMagic[4] = {'E', 'P', 'L', '3'};
constexpr std::size_t kOffFormat = 4, kOffHeaderBytes = 6, kOffKeyVersion = 8, kOffDType = 12, kOffMerge = 13,
                      kOffTokens = 16, kOffHidden = 24, kOffDeepstack = 32, kOffGrid = 40, kOffPayload = 64,
                      kOffKey = 72, kOffChecksum = 104, kOffKeyId = 104, kOffIv = 108, kOffTag = 120;
static_assert(kOffChecksum + 8 == kL3HeaderBytes);
static_assert(kOffTag + 16 == kL3KeyedHeaderBytes);
// The optional cost field: the last 8 bytes of a header that is that much
// longer than the format's base header.
constexpr std::size_t kCostBytes = 8;
static_assert(kL3HeaderBytes + kCostBytes == kL3CostedHeaderBytes);
static_assert(kL3KeyedHeaderBytes + kCostBytes == kL3KeyedCostedHeaderBytes);
// Rows are scanned in blocks that stay in L1 between the copy, the hash and
// the finiteness check.
constexpr std::size_t kScanBlock = std::size_t{16} * 1024;

void PutLe(std::uint64_t v, std::size_t n, char* out) {
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
std::uint64_t GetLe(const char* in, std::size_t n) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < n; ++i) v |= std::uint64_t{static_cast<unsigned char>(in[i])} << (8 * i);
  return v;
}

Status Corrupt(const std::string& what) { return Status(StatusCode::kDataLoss, "L3 value rejected: " + what); }
Status Unauthentic(const std::string& what) {
  return Status(StatusCode::kUnauthenticated, "L3 value not authenticated: " + what);
}

// What covers the bytes: XXH3-64 (format 1) or GMAC (format 2).
class Digest {
 public:
  Digest() : xxh_(XXH3_createState()) { XXH3_64bits_reset(xxh_); }
  Digest(const L3Key& key, const char* iv) {
    Gmac::Iv v;
    std::memcpy(v.data(), iv, v.size());
    gmac_ = std::make_unique<Gmac>(key.value_key, v);
  }
  ~Digest() {
    if (xxh_ != nullptr) XXH3_freeState(xxh_);
  }
  Digest(const Digest&) = delete;
  Digest& operator=(const Digest&) = delete;

  void Update(const char* p, std::size_t n) {
    if (gmac_ != nullptr) {
      gmac_->Update(p, n);
    } else {
      XXH3_64bits_update(xxh_, p, n);
    }
  }
  std::uint64_t Checksum() { return XXH3_64bits_digest(xxh_); }
  StatusOr<Gmac::Tag> Tag() { return gmac_->Final(); }

 private:
  XXH3_state_t* xxh_ = nullptr;
  std::unique_ptr<Gmac> gmac_;
};

// The one pass over the rows: appends them to `main` and `deepstack`,
// feeds them to `digest` and checks them for finiteness, block by block.
// Returns whether every element was finite.
bool RowScan(const char* rows, Embedding& e, Digest& digest) {
  bool finite = true;
  const std::size_t main_bytes = e.main_bytes();
  const std::size_t total = e.ExpectedBytes();
  e.main.reserve(main_bytes);
  e.deepstack.reserve(total - main_bytes);
  for (std::size_t off = 0; off < total;) {
    // Blocks end at the main/deepstack boundary (a multiple of the element
    // size, as kScanBlock is).
    const std::size_t end = std::min(off + kScanBlock, off < main_bytes ? main_bytes : total);
    const char* p = rows + off;
    const auto* b = reinterpret_cast<const std::byte*>(p);
    std::vector<std::byte>& out = off < main_bytes ? e.main : e.deepstack;
    out.insert(out.end(), b, b + (end - off));
    digest.Update(p, end - off);
    finite = ElementsFinite(e.dtype, b, end - off) && finite;
    off = end;
  }
  return finite;
}

// Checks bytes [0, 104) (shared by both formats) and the value's size, and
// fills `e`'s shape and grid. `merge` is the merge size the grid must agree
// with. kDataLoss naming the first mismatch.
Status CheckHeader(std::string_view value, std::size_t header_bytes, const ContentKey& key, std::uint32_t key_version,
                   std::int64_t merge, Embedding& e) {
  const char* h = value.data();
  if (const std::uint64_t v = GetLe(h + kOffKeyVersion, 4); v != key_version) {
    return Corrupt("content key version " + std::to_string(v) + ", this build uses " + std::to_string(key_version));
  }
  const std::uint64_t dtype = GetLe(h + kOffDType, 1);
  if (dtype > static_cast<std::uint8_t>(DType::kFloat16)) return Corrupt("unknown dtype " + std::to_string(dtype));
  if (GetLe(h + kOffMerge + 1, 2) != 0) return Corrupt("reserved header bytes 14..15 are not zero");
  e.dtype = static_cast<DType>(dtype);
  e.tokens = static_cast<std::int64_t>(GetLe(h + kOffTokens, 8));
  e.hidden = static_cast<std::int64_t>(GetLe(h + kOffHidden, 8));
  e.deepstack_layers = static_cast<std::int64_t>(GetLe(h + kOffDeepstack, 8));
  e.grid.t = static_cast<std::int64_t>(GetLe(h + kOffGrid, 8));
  e.grid.h = static_cast<std::int64_t>(GetLe(h + kOffGrid + 8, 8));
  e.grid.w = static_cast<std::int64_t>(GetLe(h + kOffGrid + 16, 8));
  // Bounded so the byte count below cannot overflow: 2^24 rows or columns,
  // 2^10 deepstack layers are far beyond any vision tower.
  if (e.tokens < 0 || e.hidden < 0 || e.deepstack_layers < 0 || e.tokens > (1 << 24) || e.hidden > (1 << 24) ||
      e.deepstack_layers > (1 << 10)) {
    return Corrupt("shape out of range (tokens " + std::to_string(e.tokens) + ", hidden " + std::to_string(e.hidden) +
                   ", deepstack layers " + std::to_string(e.deepstack_layers) + ")");
  }
  const std::string grid = "grid " + e.grid.ToString();
  if (e.grid.t <= 0 || e.grid.h <= 0 || e.grid.w <= 0) return Corrupt("degenerate " + grid);
  // 128-bit products: each side is below 2^63, merge below 2^7.
  const __int128 patches = static_cast<__int128>(e.grid.t) * e.grid.h * e.grid.w;
  if (patches != static_cast<__int128>(e.tokens) * merge * merge) {
    return Corrupt(grid + " with merge size " + std::to_string(merge) + " does not give " + std::to_string(e.tokens) +
                   " tokens");
  }
  const std::uint64_t payload = GetLe(h + kOffPayload, 8);
  if (payload != e.ExpectedBytes()) {
    return Corrupt("payload of " + std::to_string(payload) + " bytes, but the shape needs " +
                   std::to_string(e.ExpectedBytes()));
  }
  if (value.size() - header_bytes != payload) {
    return Corrupt("value of " + std::to_string(value.size()) + " bytes, header says " +
                   std::to_string(header_bytes + payload) + " (truncated or padded)");
  }
  if (std::memcmp(h + kOffKey, key.bytes.data(), key.bytes.size()) != 0) {
    return Corrupt("stored for another content key");
  }
  return Status::Ok();
}

// Bytes [0, 104) of either format, with `format`, `header_bytes` and `merge`.
void PutCommonHeader(const ContentKey& key, const Embedding& e, std::uint32_t key_version, std::uint16_t format,
                     std::size_t header_bytes, std::int64_t merge, char* h) {
  std::memcpy(h, kMagic, 4);
  PutLe(format, 2, h + kOffFormat);
  PutLe(header_bytes, 2, h + kOffHeaderBytes);
  PutLe(key_version, 4, h + kOffKeyVersion);
  PutLe(static_cast<std::uint8_t>(e.dtype), 1, h + kOffDType);
  PutLe(static_cast<std::uint64_t>(merge), 1, h + kOffMerge);
  PutLe(static_cast<std::uint64_t>(e.tokens), 8, h + kOffTokens);
  PutLe(static_cast<std::uint64_t>(e.hidden), 8, h + kOffHidden);
  PutLe(static_cast<std::uint64_t>(e.deepstack_layers), 8, h + kOffDeepstack);
  PutLe(static_cast<std::uint64_t>(e.grid.t), 8, h + kOffGrid);
  PutLe(static_cast<std::uint64_t>(e.grid.h), 8, h + kOffGrid + 8);
  PutLe(static_cast<std::uint64_t>(e.grid.w), 8, h + kOffGrid + 16);
  PutLe(e.main.size() + e.deepstack.size(), 8, h + kOffPayload);
  std::memcpy(h + kOffKey, key.bytes.data(), key.bytes.size());
}

// Whether the format 2 value's tag matches, over the whole value as it is.
// The cost field, when present, lies between the tag and the rows, so one
// update covers both.
bool TagMatches(std::string_view value, const L3Key& k) {
  Digest d(k, value.data() + kOffIv);
  d.Update(value.data(), kOffTag);
  d.Update(value.data() + kL3KeyedHeaderBytes, value.size() - kL3KeyedHeaderBytes);
  StatusOr<Gmac::Tag> tag = d.Tag();
  return tag.ok() && TagsEqual(tag->data(), value.data() + kOffTag, tag->size());
}

// The header length a value declares, when it is `base` or `base` plus the
// cost field; 0 otherwise.
std::size_t HeaderBytes(const char* h, std::size_t base) {
  const std::uint64_t n = GetLe(h + kOffHeaderBytes, 2);
  return n == base || n == base + kCostBytes ? static_cast<std::size_t>(n) : 0;
}

std::string HeaderSizes(std::size_t base) { return std::to_string(base) + " or " + std::to_string(base + kCostBytes); }

// The cost field of a header of `header_bytes` (base `base`): its seconds,
// kL3Unmeasured when the header has none. kDataLoss for a negative or
// non-finite cost.
StatusOr<double> ReadCost(const char* h, std::size_t header_bytes, std::size_t base) {
  if (header_bytes == base) return kL3Unmeasured;
  double seconds;
  const std::uint64_t bits = GetLe(h + base, kCostBytes);
  std::memcpy(&seconds, &bits, sizeof seconds);
  if (!(std::isfinite(seconds) && seconds >= 0)) return Corrupt("encode cost " + std::to_string(seconds) + " s");
  return seconds;
}

StatusOr<EmbeddingPtr> DecodeChecksummed(std::string_view value, const ContentKey& key, std::uint32_t key_version,
                                         std::int64_t merge, double* cost) {
  const char* h = value.data();
  const std::size_t hb = HeaderBytes(h, kL3HeaderBytes);
  if (hb == 0) {
    return Corrupt("header of " + std::to_string(GetLe(h + kOffHeaderBytes, 2)) + " bytes, expected " +
                   HeaderSizes(kL3HeaderBytes));
  }
  if (value.size() < hb) return Corrupt("shorter than its header (truncated)");
  if (GetLe(h + kOffMerge, 1) != 0) return Corrupt("format 1 with a merge size byte set");
  auto e = std::make_shared<Embedding>();
  if (Status s = CheckHeader(value, hb, key, key_version, merge, *e); !s.ok()) return s;
  Digest d;
  d.Update(h, kOffChecksum);
  d.Update(h + kL3HeaderBytes, hb - kL3HeaderBytes);  // the cost field, if any
  const bool finite = RowScan(h + hb, *e, d);
  if (GetLe(h + kOffChecksum, 8) != d.Checksum()) return Corrupt("checksum mismatch");
  if (!finite) return Corrupt("non-finite row values (NaN or Inf)");
  StatusOr<double> seconds = ReadCost(h, hb, kL3HeaderBytes);
  if (!seconds.ok()) return seconds.status();
  if (cost != nullptr) *cost = *seconds;
  return EmbeddingPtr(std::move(e));
}

StatusOr<EmbeddingPtr> DecodeAuthenticated(std::string_view value, const ContentKey& key, std::uint32_t key_version,
                                           std::int64_t merge, const L3Keyring& ring, double* cost) {
  const char* h = value.data();
  const std::size_t hb = HeaderBytes(h, kL3KeyedHeaderBytes);
  if (hb == 0) {
    return Unauthentic("header of " + std::to_string(GetLe(h + kOffHeaderBytes, 2)) + " bytes, expected " +
                       HeaderSizes(kL3KeyedHeaderBytes));
  }
  if (value.size() < hb) return Unauthentic("shorter than its header (truncated)");
  const auto id = static_cast<std::uint32_t>(GetLe(h + kOffKeyId, 4));
  const L3Key* k = ring.Find(id);
  if (k == nullptr) {
    return Unauthentic("under key id " + std::to_string(id) + ", which this server does not hold (" + ring.Describe() +
                       "): unknown, or retired by a rotation");
  }
  auto e = std::make_shared<Embedding>();
  Status header = CheckHeader(value, hb, key, key_version, merge, *e);
  if (header.ok() && GetLe(h + kOffMerge, 1) != static_cast<std::uint64_t>(merge)) {
    header = Corrupt("merge size " + std::to_string(GetLe(h + kOffMerge, 1)) + ", this server's tower merges " +
                     std::to_string(merge));
  }
  if (!header.ok()) return TagMatches(value, *k) ? header : Unauthentic("tag mismatch (forged or altered value)");
  Digest d(*k, h + kOffIv);
  d.Update(h, kOffTag);
  d.Update(h + kL3KeyedHeaderBytes, hb - kL3KeyedHeaderBytes);  // the cost field, if any
  const bool finite = RowScan(h + hb, *e, d);
  StatusOr<Gmac::Tag> tag = d.Tag();
  if (!tag.ok()) return tag.status();
  if (!TagsEqual(tag->data(), h + kOffTag, tag->size())) return Unauthentic("tag mismatch (forged or altered value)");
  if (!finite) return Corrupt("non-finite row values (NaN or Inf)");
  StatusOr<double> seconds = ReadCost(h, hb, kL3KeyedHeaderBytes);
  if (!seconds.ok()) return seconds.status();
  if (cost != nullptr) *cost = *seconds;
  return EmbeddingPtr(std::move(e));
}

}  // namespace

std::string EncodeL3Value(const ContentKey& key, const Embedding& e, std::uint32_t key_version, const L3ValueOptions& o,
                          double encode_seconds) {
  const bool keyed = o.keyring != nullptr;
  const std::size_t base = keyed ? kL3KeyedHeaderBytes : kL3HeaderBytes;
  const bool costed = std::isfinite(encode_seconds) && encode_seconds >= 0;
  const std::size_t header = base + (costed ? kCostBytes : 0);
  const std::size_t payload = e.main.size() + e.deepstack.size();
  std::string out(header + payload, '\0');
  char* h = out.data();
  PutCommonHeader(key, e, key_version, keyed ? kL3FormatAuthenticated : kL3FormatChecksummed, header,
                  keyed ? o.merge_size : 0, h);
  if (costed) {
    std::uint64_t bits;
    std::memcpy(&bits, &encode_seconds, sizeof bits);
    PutLe(bits, kCostBytes, h + base);
  }
  char* rows = h + header;
  if (!e.main.empty()) std::memcpy(rows, e.main.data(), e.main.size());
  if (!e.deepstack.empty()) std::memcpy(rows + e.main.size(), e.deepstack.data(), e.deepstack.size());
  if (!keyed) {
    Digest d;
    d.Update(h, kOffChecksum);
    d.Update(h + base, header - base);  // the cost field, if any
    d.Update(rows, payload);
    PutLe(d.Checksum(), 8, h + kOffChecksum);
    return out;
  }
  const L3Key& k = o.keyring->current();
  PutLe(k.id, 4, h + kOffKeyId);
  Gmac::Iv iv;
  if (Status s = RandomBytes(iv); !s.ok()) throw Error(s);
  std::memcpy(h + kOffIv, iv.data(), iv.size());
  Digest d(k, h + kOffIv);
  d.Update(h, kOffTag);
  d.Update(h + base, header - base);  // the cost field, if any
  d.Update(rows, payload);
  StatusOr<Gmac::Tag> tag = d.Tag();
  if (!tag.ok()) throw Error(tag.status());
  std::memcpy(h + kOffTag, tag->data(), tag->size());
  return out;
}

StatusOr<EmbeddingPtr> DecodeL3Value(std::string_view value, const ContentKey& key, std::uint32_t key_version,
                                     const L3ValueOptions& o, double* encode_seconds) {
  const L3Keyring* ring = o.keyring.get();
  auto reject = [&](const std::string& why) { return ring != nullptr ? Unauthentic(why) : Corrupt(why); };
  if (value.size() < kOffKeyId) {
    return reject(std::to_string(value.size()) + " bytes, shorter than any header");
  }
  const char* h = value.data();
  if (std::memcmp(h, kMagic, 4) != 0) return reject("bad magic (not an epd L3 value)");
  const std::uint64_t f = GetLe(h + kOffFormat, 2);
  if (ring != nullptr && f == kL3FormatAuthenticated)
    return DecodeAuthenticated(value, key, key_version, o.merge_size, *ring, encode_seconds);
  if (ring == nullptr && f == kL3FormatChecksummed) {
    return DecodeChecksummed(value, key, key_version, o.merge_size, encode_seconds);
  }
  if (ring != nullptr && f == kL3FormatChecksummed) {
    return Unauthentic("format 1 carries no MAC, and this server requires one (--l3-key-file)");
  }
  if (ring == nullptr && f == kL3FormatAuthenticated) {
    return Corrupt("format 2 (MAC under key id " + std::to_string(GetLe(h + kOffKeyId, 4)) +
                   "), and this server has no --l3-key-file to check it");
  }
  return reject("format version " + std::to_string(f) + ", this build reads " +
                std::to_string(ring != nullptr ? kL3FormatAuthenticated : kL3FormatChecksummed));
}

}  // namespace epd
