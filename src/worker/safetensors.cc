// The writer builds the JSON header first (nlohmann::json keeps object keys
// sorted, so the header text is a pure function of the entries), then appends
// each tensor's bytes in the same ascending-key order the offsets were
// assigned in. The reader validates everything a hostile or truncated file can
// get wrong (header length past the end, offsets outside the buffer or not
// matching dtype x shape, unknown dtypes, main/deepstack row mismatch) before
// it copies any bytes into an Embedding.
#include "epd/worker/safetensors.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

namespace epd {
namespace {

using nlohmann::json;

constexpr std::string_view kDeepstackSuffix = ".deepstack";
constexpr std::string_view kGridSuffix = ".grid_thw";
// The grid tensor: I64 [3] = t, h, w; 24 bytes.
constexpr std::size_t kGridBytes = 3 * sizeof(std::int64_t);
// A sanity bound on the header: 100 MB, as the safetensors reference reader.
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

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

std::optional<DType> ParseDType(std::string_view name) {
  for (DType d : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    if (DTypeSafetensorsName(d) == name) return d;
  }
  return std::nullopt;
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

void AppendLe64(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::int64_t ReadLe64(std::string_view b) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<std::uint8_t>(b[i]);
  return static_cast<std::int64_t>(v);
}

Status Malformed(const std::string& what) { return InvalidArgument("malformed safetensors: " + what); }

// A "<key>.grid_thw" entry: dtype I64, shape [3], 24 bytes inside `data`,
// three positive values.
StatusOr<GridTHW> ParseGrid(const std::string& name, const json& v, std::string_view data) {
  const json& shape = v["shape"];
  const json& offs = v["data_offsets"];
  if (v["dtype"] != "I64" || shape != json::array({3})) {
    return Malformed("tensor '" + name + "' is " + v["dtype"].dump() + " " + shape.dump() + ", expected \"I64\" [3]");
  }
  if (offs.size() != 2 || !offs[0].is_number_unsigned() || !offs[1].is_number_unsigned()) {
    return Malformed("tensor '" + name + "' data_offsets " + offs.dump() + " is not [begin, end]");
  }
  const std::uint64_t begin = offs[0].get<std::uint64_t>(), end = offs[1].get<std::uint64_t>();
  if (begin > end || end > data.size() || end - begin != kGridBytes) {
    return Malformed("tensor '" + name + "' data_offsets " + offs.dump() + " are not 24 bytes inside the " +
                     std::to_string(data.size()) + "-byte data section");
  }
  const std::string_view b = data.substr(begin, kGridBytes);
  const GridTHW g{ReadLe64(b), ReadLe64(b.substr(8)), ReadLe64(b.substr(16))};
  if (!g.known()) {
    return Malformed("tensor '" + name + "' holds [" + std::to_string(g.t) + ", " + std::to_string(g.h) + ", " +
                     std::to_string(g.w) + "]; t, h and w must be positive");
  }
  return g;
}

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

  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  auto add = [&](const std::string& name, const Embedding& m, std::int64_t cols, std::size_t nbytes) {
    header[name] = {{"dtype", std::string(DTypeSafetensorsName(m.dtype))},
                    {"shape", {m.tokens, cols}},
                    {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  };
  for (const KeyedEmbedding* e : *sorted) {
    const Embedding& m = *e->embedding;
    const std::string hex = e->key.Hex();
    add(hex, m, m.hidden, m.main.size());
    if (m.deepstack_layers > 0)
      add(hex + std::string(kDeepstackSuffix), m, m.hidden * m.deepstack_layers, m.deepstack.size());
    if (m.grid.known()) {
      header[hex + std::string(kGridSuffix)] = {
          {"dtype", "I64"}, {"shape", json::array({3})}, {"data_offsets", {offset, offset + kGridBytes}}};
      offset += kGridBytes;
    }
  }
  std::string text = header.dump();
  // Pad so the data starts 8-byte aligned (8-byte length prefix + header).
  text.append((8 - text.size() % 8) % 8, ' ');

  std::string out;
  out.reserve(8 + text.size() + offset);
  AppendLe64(out, text.size());
  out += text;
  for (const KeyedEmbedding* e : *sorted) {
    const Embedding& m = *e->embedding;
    out.append(reinterpret_cast<const char*>(m.main.data()), m.main.size());
    if (m.deepstack_layers > 0) out.append(reinterpret_cast<const char*>(m.deepstack.data()), m.deepstack.size());
    if (m.grid.known()) {
      for (std::int64_t v : {m.grid.t, m.grid.h, m.grid.w}) AppendLe64(out, static_cast<std::uint64_t>(v));
    }
  }
  return out;
}

Status WriteEmbeddingsSafetensors(const std::string& path, std::span<const KeyedEmbedding> entries,
                                  const std::map<std::string, std::string>& metadata) {
  auto bytes = SerializeEmbeddingsSafetensors(entries, metadata);
  if (!bytes.ok()) return bytes.status();
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return Status(StatusCode::kUnavailable, "cannot open " + tmp + " for writing");
    f.write(bytes->data(), static_cast<std::streamsize>(bytes->size()));
    f.close();
    if (!f) {
      std::remove(tmp.c_str());
      return Status(StatusCode::kUnavailable, "cannot write " + tmp);
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return Status(StatusCode::kUnavailable, "cannot rename " + tmp + " to " + path);
  }
  return Status::Ok();
}

StatusOr<SafetensorsContents> ParseEmbeddingsSafetensors(std::string_view bytes) {
  if (bytes.size() < 8)
    return Malformed("file is " + std::to_string(bytes.size()) + " bytes, shorter than the 8-byte header length");
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<std::uint8_t>(bytes[i]);
  if (n > kMaxHeaderBytes || n > bytes.size() - 8) {
    return Malformed("header length " + std::to_string(n) + " exceeds the file (" + std::to_string(bytes.size()) +
                     " bytes)");
  }
  const std::string_view data = bytes.substr(8 + n);
  json header = json::parse(bytes.substr(8, n), nullptr, /*allow_exceptions=*/false);
  if (!header.is_object()) return Malformed("header is not a JSON object");

  SafetensorsContents out;
  struct Tensor {
    DType dtype;
    std::int64_t rows, cols;
    std::string_view bytes;
  };
  std::map<ContentKey, Tensor> mains, deeps;
  std::map<ContentKey, GridTHW> grids;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) return Malformed("__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) return Malformed("__metadata__ value '" + m.key() + "' is not a string");
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
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
    if (!key) return Malformed("tensor name '" + name + "' is not a 64-digit hex key");
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets") ||
        !v["dtype"].is_string() || !v["shape"].is_array() || !v["data_offsets"].is_array()) {
      return Malformed("tensor '" + name + "' lacks dtype, shape or data_offsets");
    }
    if (grid) {
      StatusOr<GridTHW> g = ParseGrid(name, v, data);
      if (!g.ok()) return g.status();
      grids[*key] = *g;
      continue;
    }
    const std::optional<DType> dtype = ParseDType(v["dtype"].get<std::string>());
    if (!dtype) return Malformed("tensor '" + name + "' has unsupported dtype " + v["dtype"].dump());
    const json& shape = v["shape"];
    const json& offs = v["data_offsets"];
    if (shape.size() != 2 || !shape[0].is_number_unsigned() || !shape[1].is_number_unsigned()) {
      return Malformed("tensor '" + name + "' shape " + shape.dump() + " is not [rows, cols]");
    }
    if (offs.size() != 2 || !offs[0].is_number_unsigned() || !offs[1].is_number_unsigned()) {
      return Malformed("tensor '" + name + "' data_offsets " + offs.dump() + " is not [begin, end]");
    }
    const std::uint64_t rows = shape[0].get<std::uint64_t>(), cols = shape[1].get<std::uint64_t>();
    const std::uint64_t begin = offs[0].get<std::uint64_t>(), end = offs[1].get<std::uint64_t>();
    if (begin > end || end > data.size()) {
      return Malformed("tensor '" + name + "' data_offsets " + offs.dump() + " fall outside the " +
                       std::to_string(data.size()) + "-byte data section");
    }
    // Bound each factor before multiplying so the product cannot overflow.
    if (rows > data.size() || cols > data.size() || rows * cols * DTypeSize(*dtype) != end - begin) {
      return Malformed("tensor '" + name + "' shape " + shape.dump() + " does not match its " +
                       std::to_string(end - begin) + " bytes");
    }
    Tensor t{*dtype, static_cast<std::int64_t>(rows), static_cast<std::int64_t>(cols), data.substr(begin, end - begin)};
    (deep ? deeps : mains)[*key] = t;
  }

  for (const auto& [key, main] : mains) {
    auto e = std::make_shared<Embedding>();
    e->tokens = main.rows;
    e->hidden = main.cols;
    e->dtype = main.dtype;
    const auto* p = reinterpret_cast<const std::byte*>(main.bytes.data());
    e->main.assign(p, p + main.bytes.size());
    if (auto g = grids.find(key); g != grids.end()) {
      e->grid = g->second;
      grids.erase(g);
    }
    if (auto d = deeps.find(key); d != deeps.end()) {
      const Tensor& ds = d->second;
      if (ds.dtype != main.dtype || ds.rows != main.rows || main.cols == 0 || ds.cols % main.cols != 0) {
        return Malformed("deepstack tensor of " + key.Hex() + " does not match its main tensor");
      }
      e->deepstack_layers = ds.cols / main.cols;
      const auto* q = reinterpret_cast<const std::byte*>(ds.bytes.data());
      e->deepstack.assign(q, q + ds.bytes.size());
      deeps.erase(d);
    }
    out.embeddings.push_back({key, std::move(e)});
  }
  if (!deeps.empty()) return Malformed("deepstack tensor of " + deeps.begin()->first.Hex() + " has no main tensor");
  if (!grids.empty()) return Malformed("grid_thw tensor of " + grids.begin()->first.Hex() + " has no main tensor");
  return out;
}

StatusOr<SafetensorsContents> ReadEmbeddingsSafetensors(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return Status(StatusCode::kUnavailable, "cannot open " + path);
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) return Status(StatusCode::kUnavailable, "cannot read " + path);
  return ParseEmbeddingsSafetensors(bytes);
}

}  // namespace epd
