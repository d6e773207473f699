// The embedding layout (epd/worker/safetensors.h) over the one safetensors
// codec (epd/safetensors/safetensors_codec.h): the writer turns each entry
// into named tensors (main, deepstack, grid) and lets the codec lay them out;
// the reader lets the codec validate the header (lengths, offsets, dtypes,
// byte counts) and then checks only what this layout adds (hex key names,
// embedding dtypes, [rows, cols] shapes, the grid, main/deepstack agreement)
// before it copies any bytes into an Embedding.
#include "epd/worker/safetensors.h"

#include <algorithm>
#include <fstream>
#include <iterator>
#include <optional>

#include "epd/safetensors/safetensors_codec.h"

namespace epd {
namespace {

constexpr std::string_view kDeepstackSuffix = ".deepstack";
constexpr std::string_view kGridSuffix = ".grid_thw";
// What ParseEmbeddingsSafetensors' messages start with: it has no file name.
constexpr std::string_view kBytesSource = "malformed safetensors";

std::optional<ContentKey> ParseHex(std::string_view hex) {
  if (hex.size() != 64) return std::nullopt;
  ContentKey key;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (std::size_t i = 0; i < 32; ++i) {
    const int hi = nibble(hex[2 * i]);
    const int lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    key.bytes[i] = static_cast<std::uint8_t>(hi * 16 + lo);
  }
  return key;
}

Status CheckEntry(const KeyedEmbedding& e) {
  if (e.embedding == nullptr) return InvalidArgument("embedding for key " + e.key.Hex() + " is null");
  const Embedding& m = *e.embedding;
  if (m.tokens < 0 || m.hidden < 0 || m.deepstack_layers < 0) {
    return InvalidArgument("embedding for key " + e.key.Hex() + " has a negative dimension");
  }
  const std::size_t main_bytes = static_cast<std::size_t>(m.tokens * m.hidden) * DTypeSize(m.dtype);
  if (m.main.size() != main_bytes || m.deepstack.size() != m.ExpectedBytes() - main_bytes) {
    return InvalidArgument("embedding for key " + e.key.Hex() + " holds " + std::to_string(m.main.size()) + "+" +
                           std::to_string(m.deepstack.size()) + " bytes, its shape needs " +
                           std::to_string(main_bytes) + "+" + std::to_string(m.ExpectedBytes() - main_bytes));
  }
  return Status::Ok();
}

// Distinct entries in ascending key order; fails on two different
// embeddings under one key.
StatusOr<std::vector<const KeyedEmbedding*>> SortedDistinct(std::span<const KeyedEmbedding> entries) {
  std::vector<const KeyedEmbedding*> sorted;
  sorted.reserve(entries.size());
  for (const KeyedEmbedding& e : entries) {
    if (Status s = CheckEntry(e); !s.ok()) return s;
    sorted.push_back(&e);
  }
  // stable: among duplicates the first entry stays first and is kept.
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const KeyedEmbedding* a, const KeyedEmbedding* b) { return a->key < b->key; });
  std::vector<const KeyedEmbedding*> out;
  for (const KeyedEmbedding* e : sorted) {
    if (!out.empty() && out.back()->key == e->key) {
      const Embedding& a = *out.back()->embedding;
      const Embedding& b = *e->embedding;
      if (out.back()->embedding != e->embedding &&
          (a.shape() != b.shape() || a.grid != b.grid || a.main != b.main || a.deepstack != b.deepstack)) {
        return InvalidArgument("two different embeddings under key " + e->key.Hex());
      }
      continue;
    }
    out.push_back(e);
  }
  return out;
}

// Eight little-endian bytes of each value, as the file holds an I64.
std::string Le64Bytes(std::initializer_list<std::int64_t> values) {
  std::string out;
  for (std::int64_t v : values) {
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((static_cast<std::uint64_t>(v) >> (8 * i)) & 0xff));
  }
  return out;
}

std::int64_t ReadLe64(std::span<const std::byte> b) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<std::uint8_t>(b[i]);
  return static_cast<std::int64_t>(v);
}

// The layout's rules over the tensors the codec validated; `source` starts
// every message.
class EmbeddingReader {
 public:
  explicit EmbeddingReader(std::string_view source) : source_(source) {}

  StatusOr<SafetensorsContents> Read(std::string_view bytes) {
    StatusOr<ParsedSafetensors> parsed = ParseSafetensors(std::as_bytes(std::span(bytes)), source_);
    if (!parsed.ok()) return parsed.status();
    for (const auto& [name, t] : parsed->tensors) {
      if (Status s = Place(name, t); !s.ok()) return s;
    }
    SafetensorsContents out;
    out.metadata = std::move(parsed->metadata);
    for (const auto& [key, main] : mains_) {
      StatusOr<EmbeddingPtr> e = Assemble(key, *main);
      if (!e.ok()) return e.status();
      out.embeddings.push_back({key, std::move(*e)});
    }
    if (!deeps_.empty()) return Bad("deepstack tensor of " + deeps_.begin()->first.Hex() + " has no main tensor");
    if (!grids_.empty()) return Bad("grid_thw tensor of " + grids_.begin()->first.Hex() + " has no main tensor");
    return out;
  }

 private:
  Status Bad(const std::string& what) const { return InvalidArgument(std::string(source_) + ": " + what); }

  // Files one tensor under its key as main, deepstack or grid.
  Status Place(const std::string& name, const TensorView& t) {
    std::string_view stem = name;
    bool deep = false, grid = false;
    if (stem.size() > kDeepstackSuffix.size() && stem.ends_with(kDeepstackSuffix)) {
      stem.remove_suffix(kDeepstackSuffix.size());
      deep = true;
    } else if (stem.size() > kGridSuffix.size() && stem.ends_with(kGridSuffix)) {
      stem.remove_suffix(kGridSuffix.size());
      grid = true;
    }
    const std::optional<ContentKey> key = ParseHex(stem);
    if (!key) return Bad("tensor name '" + name + "' is not a 64-digit hex key");
    if (grid) {
      StatusOr<GridTHW> g = ParseGrid(name, t);
      if (!g.ok()) return g.status();
      grids_[*key] = *g;
      return Status::Ok();
    }
    if (!ToEmbeddingDType(t.dtype)) {
      return Bad("tensor '" + name + "' has unsupported dtype " + std::string(TensorDTypeName(t.dtype)));
    }
    if (t.shape.size() != 2)
      return Bad("tensor '" + name + "' shape " + ShapeToString(t.shape) + " is not [rows, cols]");
    (deep ? deeps_ : mains_)[*key] = &t;
    return Status::Ok();
  }

  // A "<key>.grid_thw" tensor: I64 [3] (so 24 bytes, which the codec
  // checked), three positive values.
  StatusOr<GridTHW> ParseGrid(const std::string& name, const TensorView& t) const {
    if (t.dtype != TensorDType::kI64 || t.shape != std::vector<std::int64_t>{3}) {
      return Bad("tensor '" + name + "' is " + std::string(TensorDTypeName(t.dtype)) + " " + ShapeToString(t.shape) +
                 ", expected I64 [3]");
    }
    const GridTHW g{ReadLe64(t.bytes), ReadLe64(t.bytes.subspan(8)), ReadLe64(t.bytes.subspan(16))};
    if (!g.known()) {
      return Bad("tensor '" + name + "' holds [" + std::to_string(g.t) + ", " + std::to_string(g.h) + ", " +
                 std::to_string(g.w) + "]; t, h and w must be positive");
    }
    return g;
  }

  StatusOr<EmbeddingPtr> Assemble(const ContentKey& key, const TensorView& main) {
    auto e = std::make_shared<Embedding>();
    e->tokens = main.shape[0];
    e->hidden = main.shape[1];
    e->dtype = *ToEmbeddingDType(main.dtype);
    e->main.assign(main.bytes.begin(), main.bytes.end());
    if (auto g = grids_.find(key); g != grids_.end()) {
      e->grid = g->second;
      grids_.erase(g);
    }
    if (auto d = deeps_.find(key); d != deeps_.end()) {
      const TensorView& ds = *d->second;
      if (ds.dtype != main.dtype || ds.shape[0] != main.shape[0] || main.shape[1] == 0 ||
          ds.shape[1] % main.shape[1] != 0) {
        return Bad("deepstack tensor of " + key.Hex() + " does not match its main tensor");
      }
      e->deepstack_layers = ds.shape[1] / main.shape[1];
      e->deepstack.assign(ds.bytes.begin(), ds.bytes.end());
      deeps_.erase(d);
    }
    return EmbeddingPtr(std::move(e));
  }

  std::string_view source_;
  std::map<ContentKey, const TensorView*> mains_, deeps_;
  std::map<ContentKey, GridTHW> grids_;
};

}  // namespace

StatusOr<std::string> SerializeEmbeddingsSafetensors(std::span<const KeyedEmbedding> entries,
                                                     const std::map<std::string, std::string>& metadata) {
  // Entries whose bytes are in device or pinned memory (a GPU tier) are
  // copied to the host first; host entries are used as they are.
  std::vector<KeyedEmbedding> on_host;
  if (std::any_of(entries.begin(), entries.end(),
                  [](const KeyedEmbedding& e) { return e.embedding != nullptr && !e.embedding->on_host(); })) {
    on_host.assign(entries.begin(), entries.end());
    for (KeyedEmbedding& e : on_host) {
      if (e.embedding == nullptr) continue;
      StatusOr<EmbeddingPtr> h = ToHost(e.embedding);
      if (!h.ok()) return Status(h.status().code(), "embedding for key " + e.key.Hex() + ": " + h.status().message());
      e.embedding = std::move(*h);
    }
    entries = on_host;
  }
  auto sorted = SortedDistinct(entries);
  if (!sorted.ok()) return sorted.status();

  // The codec orders tensors by name, which is ascending key and, per key,
  // main, deepstack, grid (the suffixes sort in that order after the key).
  std::vector<std::string> grids;  // the I64 bytes of each grid, alive for the call
  grids.reserve(sorted->size());
  std::vector<NamedTensor> tensors;
  tensors.reserve(3 * sorted->size());
  for (const KeyedEmbedding* e : *sorted) {
    const Embedding& m = *e->embedding;
    const std::string hex = e->key.Hex();
    const TensorDType dtype = ToTensorDType(m.dtype);
    tensors.push_back({hex, {dtype, {m.tokens, m.hidden}, m.main}});
    if (m.deepstack_layers > 0) {
      tensors.push_back(
          {hex + std::string(kDeepstackSuffix), {dtype, {m.tokens, m.hidden * m.deepstack_layers}, m.deepstack}});
    }
    if (m.grid.known()) {
      grids.push_back(Le64Bytes({m.grid.t, m.grid.h, m.grid.w}));
      tensors.push_back(
          {hex + std::string(kGridSuffix), {TensorDType::kI64, {3}, std::as_bytes(std::span(grids.back()))}});
    }
  }
  return SerializeSafetensors(tensors, metadata);
}

Status WriteEmbeddingsSafetensors(const std::string& path, std::span<const KeyedEmbedding> entries,
                                  const std::map<std::string, std::string>& metadata) {
  auto bytes = SerializeEmbeddingsSafetensors(entries, metadata);
  if (!bytes.ok()) return bytes.status();
  return WriteFileAtomically(path, *bytes);
}

StatusOr<SafetensorsContents> ParseEmbeddingsSafetensors(std::string_view bytes) {
  return EmbeddingReader(kBytesSource).Read(bytes);
}

StatusOr<SafetensorsContents> ReadEmbeddingsSafetensors(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return Status(StatusCode::kUnavailable, "cannot open " + path);
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) return Status(StatusCode::kUnavailable, "cannot read " + path);
  const std::string source = "safetensors file " + path;
  return EmbeddingReader(source).Read(bytes);
}

}  // namespace epd
