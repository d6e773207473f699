// nlohmann::json parses and writes the header; its exceptions become
// kInvalidArgument here and never leave this file (it is a private
// dependency: the public header mentions none of it).
//
// Every size check is done in unsigned 64-bit arithmetic with explicit
// overflow guards before any pointer is formed, so a header that claims 2^63
// elements or an offset past the end yields a Status, never an out-of-bounds
// view.
#include "epd/safetensors/safetensors_codec.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <system_error>
#include <utility>

namespace epd {
namespace {

using nlohmann::json;

// The safetensors reference implementation refuses headers over 100 MB.
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;
constexpr std::string_view kMetadataKey = "__metadata__";

struct DTypeInfo {
  TensorDType dtype;
  std::string_view name;
  std::size_t size;
};

// Indexed by TensorDType.
constexpr std::array<DTypeInfo, 15> kDTypes = {{
    {TensorDType::kBool, "BOOL", 1},
    {TensorDType::kU8, "U8", 1},
    {TensorDType::kI8, "I8", 1},
    {TensorDType::kF8E5M2, "F8_E5M2", 1},
    {TensorDType::kF8E4M3, "F8_E4M3", 1},
    {TensorDType::kI16, "I16", 2},
    {TensorDType::kU16, "U16", 2},
    {TensorDType::kF16, "F16", 2},
    {TensorDType::kBF16, "BF16", 2},
    {TensorDType::kI32, "I32", 4},
    {TensorDType::kU32, "U32", 4},
    {TensorDType::kF32, "F32", 4},
    {TensorDType::kF64, "F64", 8},
    {TensorDType::kI64, "I64", 8},
    {TensorDType::kU64, "U64", 8},
}};

const DTypeInfo& Info(TensorDType d) { return kDTypes[static_cast<std::size_t>(d)]; }

// a * b, or nullopt on unsigned 64-bit overflow.
std::optional<std::uint64_t> MulChecked(std::uint64_t a, std::uint64_t b) {
  if (a != 0 && b > std::numeric_limits<std::uint64_t>::max() / a) return std::nullopt;
  return a * b;
}

bool IsNonNegativeInteger(const json& v) {
  return v.is_number_unsigned() || (v.is_number_integer() && v.get<std::int64_t>() >= 0);
}

// One header entry, checked against the `data_bytes` after the header.
struct Entry {
  std::string_view name;
  TensorView view;
  std::uint64_t begin = 0, end = 0;
};

class HeaderParser {
 public:
  HeaderParser(std::string_view source, std::uint64_t data_bytes) : source_(source), data_bytes_(data_bytes) {}

  Status Bad(const std::string& what) const { return InvalidArgument(std::string(source_) + ": " + what); }

  StatusOr<Entry> ParseEntry(const std::string& name, const json& entry) const {
    auto bad = [&](const std::string& what) { return Bad("tensor '" + name + "': " + what); };
    if (name.empty()) return bad("the name is empty");
    if (!entry.is_object()) return bad("entry is not an object");
    auto dt = entry.find("dtype");
    auto sh = entry.find("shape");
    auto off = entry.find("data_offsets");
    if (dt == entry.end() || !dt->is_string()) return bad("no string 'dtype'");
    if (sh == entry.end() || !sh->is_array()) return bad("no array 'shape'");
    if (off == entry.end() || !off->is_array() || off->size() != 2) return bad("no 2-element 'data_offsets'");
    const std::optional<TensorDType> dtype = ParseTensorDType(dt->get<std::string>());
    if (!dtype) return bad("unknown dtype '" + dt->get<std::string>() + "'");
    Entry e{name, {*dtype, {}, {}}};
    std::uint64_t numel = 1;
    for (const json& d : *sh) {
      if (!IsNonNegativeInteger(d)) {
        return bad("shape " + sh->dump() + " has an entry that is not a non-negative integer");
      }
      const auto v = d.get<std::uint64_t>();
      if (v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
        return bad("shape " + sh->dump() + " is too large");
      }
      const std::optional<std::uint64_t> m = MulChecked(numel, v);
      if (!m) return bad("shape " + sh->dump() + " overflows 64 bits");
      numel = *m;
      e.view.shape.push_back(static_cast<std::int64_t>(v));
    }
    if (!IsNonNegativeInteger((*off)[0]) || !IsNonNegativeInteger((*off)[1])) {
      return bad("data_offsets " + off->dump() + " are not non-negative integers");
    }
    e.begin = (*off)[0].get<std::uint64_t>();
    e.end = (*off)[1].get<std::uint64_t>();
    if (e.begin > e.end) return bad("data_offsets " + off->dump() + " end before they begin");
    if (e.end > data_bytes_) {
      return bad("data_offsets " + off->dump() + " run past the end of the data (" + std::to_string(data_bytes_) +
                 " bytes after the header; truncated?)");
    }
    const std::optional<std::uint64_t> want = MulChecked(numel, TensorDTypeSize(*dtype));
    if (!want || *want != e.end - e.begin) {
      return bad("holds " + std::to_string(e.end - e.begin) + " bytes, but " + dt->get<std::string>() + " " +
                 ShapeToString(e.view.shape) + " needs " + (want ? std::to_string(*want) : "more than 2^64"));
    }
    return e;
  }

  Status ParseMetadata(const json& entry, std::map<std::string, std::string>& out) const {
    if (!entry.is_object()) return Bad("__metadata__ is not an object");
    for (const auto& [k, v] : entry.items()) {
      if (!v.is_string()) return Bad("__metadata__ value '" + k + "' is not a string");
      out[k] = v.get<std::string>();
    }
    return Status::Ok();
  }

  // Two non-empty ranges sharing a byte; empty ranges overlap nothing.
  Status CheckNoOverlap(std::vector<Entry>& entries) const {
    std::erase_if(entries, [](const Entry& e) { return e.begin == e.end; });
    std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
    for (std::size_t i = 1; i < entries.size(); ++i) {
      const Entry& a = entries[i - 1];
      const Entry& b = entries[i];
      if (b.begin < a.end) {
        return Bad("tensors '" + std::string(a.name) + "' (data_offsets [" + std::to_string(a.begin) + "," +
                   std::to_string(a.end) + "]) and '" + std::string(b.name) + "' (data_offsets [" +
                   std::to_string(b.begin) + "," + std::to_string(b.end) + "]) overlap");
      }
    }
    return Status::Ok();
  }

 private:
  std::string_view source_;
  std::uint64_t data_bytes_;
};

}  // namespace

std::string_view TensorDTypeName(TensorDType dtype) { return Info(dtype).name; }
std::size_t TensorDTypeSize(TensorDType dtype) { return Info(dtype).size; }

std::optional<TensorDType> ParseTensorDType(std::string_view name) {
  for (const DTypeInfo& i : kDTypes) {
    if (i.name == name) return i.dtype;
  }
  return std::nullopt;
}

TensorDType ToTensorDType(DType dtype) { return *ParseTensorDType(DTypeSafetensorsName(dtype)); }

std::optional<DType> ToEmbeddingDType(TensorDType dtype) {
  for (DType d : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    if (DTypeSafetensorsName(d) == TensorDTypeName(dtype)) return d;
  }
  return std::nullopt;
}

std::string ShapeToString(std::span<const std::int64_t> shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  s += "]";
  return s;
}

StatusOr<ParsedSafetensors> ParseSafetensors(std::span<const std::byte> bytes, std::string_view source) {
  const std::uint64_t size = bytes.size();
  const HeaderParser prefix(source, 0);
  if (size < 8) {
    return prefix.Bad("is " + std::to_string(size) + " bytes, shorter than the 8-byte header length (truncated?)");
  }
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= std::uint64_t{static_cast<std::uint8_t>(bytes[i])} << (8 * i);
  if (n == 0) return prefix.Bad("header length is 0");
  if (n > kMaxHeaderBytes) return prefix.Bad("header length " + std::to_string(n) + " exceeds 100 MB");
  if (n > size - 8) {
    return prefix.Bad("header length " + std::to_string(n) + " runs past the end of the " + std::to_string(size) +
                      "-byte file (truncated?)");
  }
  const std::span<const std::byte> data = bytes.subspan(8 + n);
  const HeaderParser parser(source, data.size());

  ParsedSafetensors out;
  out.header = {reinterpret_cast<const char*>(bytes.data()) + 8, static_cast<std::size_t>(n)};
  json header;
  try {
    header = json::parse(out.header);
  } catch (const json::exception& e) {
    return parser.Bad(std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) return parser.Bad("header is not a JSON object");

  std::vector<Entry> entries;
  entries.reserve(header.size());
  for (const auto& [name, entry] : header.items()) {
    if (name == kMetadataKey) {
      if (Status s = parser.ParseMetadata(entry, out.metadata); !s.ok()) return s;
      continue;
    }
    StatusOr<Entry> e = parser.ParseEntry(name, entry);
    if (!e.ok()) return e.status();
    e->view.bytes = data.subspan(e->begin, e->end - e->begin);
    auto placed = out.tensors.emplace(name, e->view);
    e->name = placed.first->first;
    entries.push_back(std::move(*e));
  }
  if (Status s = parser.CheckNoOverlap(entries); !s.ok()) return s;
  return out;
}

StatusOr<std::string> SerializeSafetensors(std::span<const NamedTensor> tensors,
                                           const std::map<std::string, std::string>& metadata) {
  std::map<std::string_view, const TensorView*> sorted;
  for (const NamedTensor& t : tensors) {
    if (t.name.empty() || t.name == kMetadataKey) return InvalidArgument("tensor name '" + t.name + "' is reserved");
    std::optional<std::uint64_t> bytes = TensorDTypeSize(t.tensor.dtype);
    for (std::int64_t d : t.tensor.shape) {
      if (d < 0) return InvalidArgument("tensor '" + t.name + "' has a negative dimension");
      if (bytes) bytes = MulChecked(*bytes, static_cast<std::uint64_t>(d));
    }
    if (!bytes || *bytes != t.tensor.bytes.size()) {
      return InvalidArgument("tensor '" + t.name + "': " + std::to_string(t.tensor.bytes.size()) +
                             " bytes do not match " + std::string(TensorDTypeName(t.tensor.dtype)) + " " +
                             ShapeToString(t.tensor.shape));
    }
    if (!sorted.emplace(t.name, &t.tensor).second) return InvalidArgument("tensor '" + t.name + "' appears twice");
  }
  // nlohmann::json keeps object keys sorted, so the header text is a pure
  // function of the tensors, and the data goes in the same (name) order.
  json header = json::object();
  if (!metadata.empty()) header[std::string(kMetadataKey)] = metadata;
  std::uint64_t offset = 0;
  for (const auto& [name, view] : sorted) {
    header[std::string(name)] = {{"dtype", TensorDTypeName(view->dtype)},
                                 {"shape", view->shape},
                                 {"data_offsets", {offset, offset + view->bytes.size()}}};
    offset += view->bytes.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out;
  out.reserve(8 + text.size() + offset);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((text.size() >> (8 * i)) & 0xff));
  out += text;
  for (const auto& [name, view] : sorted) {
    out.append(reinterpret_cast<const char*>(view->bytes.data()), view->bytes.size());
  }
  return out;
}

Status WriteFileAtomically(const std::string& path, std::string_view bytes) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return Status(StatusCode::kUnavailable, "cannot open " + tmp + " for writing");
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    f.close();
    if (!f) {
      std::remove(tmp.c_str());
      return Status(StatusCode::kUnavailable, "cannot write " + tmp);
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::generic_category().message(errno);
    std::remove(tmp.c_str());
    return Status(StatusCode::kUnavailable, "cannot rename " + tmp + " to " + path + ": " + why);
  }
  return Status::Ok();
}

Status WriteSafetensors(const std::string& path, std::span<const NamedTensor> tensors,
                        const std::map<std::string, std::string>& metadata) {
  StatusOr<std::string> bytes = SerializeSafetensors(tensors, metadata);
  if (!bytes.ok()) return bytes.status();
  return WriteFileAtomically(path, *bytes);
}

}  // namespace epd
