// The reader maps the whole file once (PROT_READ, MAP_PRIVATE) and parses
// only the header; a tensor's bytes are paged in when someone reads them.
//
// Every size check is done in unsigned 64-bit arithmetic with explicit
// overflow guards before any pointer is formed, so a header that claims
// 2^63 elements or an offset past the end yields a Status, never an
// out-of-bounds view. nlohmann::json parses the header; its exceptions are
// turned into kInvalidArgument here.
#include "epd/model/safetensors_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

namespace epd {
namespace {

using nlohmann::json;

// The safetensors reference implementation refuses headers over 100 MB.
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

struct DTypeInfo {
  TensorDType dtype;
  std::string_view name;
  std::size_t size;
};

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

void AppendLe64(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// a * b, or nullopt on unsigned 64-bit overflow.
std::optional<std::uint64_t> MulChecked(std::uint64_t a, std::uint64_t b) {
  if (a != 0 && b > std::numeric_limits<std::uint64_t>::max() / a) return std::nullopt;
  return a * b;
}

}  // namespace

std::string_view TensorDTypeName(TensorDType dtype) { return Info(dtype).name; }
std::size_t TensorDTypeSize(TensorDType dtype) { return Info(dtype).size; }

std::optional<TensorDType> ParseTensorDType(std::string_view name) {
  for (const DTypeInfo& i : kDTypes) {
    if (i.name == name) return i.dtype;
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

SafetensorsFile::~SafetensorsFile() {
  if (base_ != nullptr) munmap(const_cast<std::byte*>(base_), size_);
}

std::string_view SafetensorsFile::header() const {
  return {reinterpret_cast<const char*>(base_) + 8, static_cast<std::size_t>(header_bytes_)};
}

const TensorView* SafetensorsFile::Find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

StatusOr<std::shared_ptr<const SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return Status(StatusCode::kNotFound, "safetensors file not found: " + path);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status(StatusCode::kUnavailable, "cannot open " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status(StatusCode::kUnavailable, path + " is not a readable regular file");
  }
  const auto size = static_cast<std::uint64_t>(st.st_size);
  auto bad = [&](const std::string& what) { return InvalidArgument("safetensors file " + path + ": " + what); };
  if (size < 8) {
    ::close(fd);
    return bad("is " + std::to_string(size) + " bytes, shorter than the 8-byte header length (truncated?)");
  }
  void* mapped = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);  // the mapping keeps the file open
  if (mapped == MAP_FAILED) return Status(StatusCode::kUnavailable, "cannot map " + path + ": " + std::strerror(errno));

  // From here on the object owns the mapping, so every early return unmaps it.
  std::shared_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->base_ = static_cast<const std::byte*>(mapped);
  file->size_ = size;

  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= std::uint64_t{static_cast<std::uint8_t>(file->base_[i])} << (8 * i);
  if (n == 0) return bad("header length is 0");
  if (n > kMaxHeaderBytes) return bad("header length " + std::to_string(n) + " exceeds 100 MB");
  if (n > size - 8) {
    return bad("header length " + std::to_string(n) + " runs past the end of the " + std::to_string(size) +
               "-byte file (truncated?)");
  }
  file->header_bytes_ = n;
  const std::uint64_t data_bytes = size - 8 - n;
  const std::byte* data = file->base_ + 8 + n;

  json header;
  try {
    header = json::parse(file->header());
  } catch (const json::exception& e) {
    return bad(std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) return bad("header is not a JSON object");

  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) return bad("__metadata__ is not an object");
      for (auto& [k, v] : entry.items()) {
        if (!v.is_string()) return bad("__metadata__ value '" + k + "' is not a string");
        file->metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    auto bad_tensor = [&](const std::string& what) { return bad("tensor '" + name + "': " + what); };
    if (!entry.is_object()) return bad_tensor("entry is not an object");
    auto dt = entry.find("dtype");
    auto sh = entry.find("shape");
    auto off = entry.find("data_offsets");
    if (dt == entry.end() || !dt->is_string()) return bad_tensor("no string 'dtype'");
    if (sh == entry.end() || !sh->is_array()) return bad_tensor("no array 'shape'");
    if (off == entry.end() || !off->is_array() || off->size() != 2) return bad_tensor("no 2-element 'data_offsets'");
    const std::optional<TensorDType> dtype = ParseTensorDType(dt->get<std::string>());
    if (!dtype) return bad_tensor("unknown dtype '" + dt->get<std::string>() + "'");
    TensorView view;
    view.dtype = *dtype;
    std::uint64_t numel = 1;
    for (const json& d : *sh) {
      if (!d.is_number_unsigned() && !(d.is_number_integer() && d.get<std::int64_t>() >= 0)) {
        return bad_tensor("shape " + sh->dump() + " has an entry that is not a non-negative integer");
      }
      const auto v = d.get<std::uint64_t>();
      if (v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
        return bad_tensor("shape " + sh->dump() + " is too large");
      }
      const std::optional<std::uint64_t> m = MulChecked(numel, v);
      if (!m) return bad_tensor("shape " + sh->dump() + " overflows 64 bits");
      numel = *m;
      view.shape.push_back(static_cast<std::int64_t>(v));
    }
    for (const json& o : *off) {
      if (!o.is_number_unsigned() && !(o.is_number_integer() && o.get<std::int64_t>() >= 0)) {
        return bad_tensor("data_offsets " + off->dump() + " are not non-negative integers");
      }
    }
    const auto begin = (*off)[0].get<std::uint64_t>();
    const auto end = (*off)[1].get<std::uint64_t>();
    if (begin > end) return bad_tensor("data_offsets " + off->dump() + " end before they begin");
    if (end > data_bytes) {
      return bad_tensor("data_offsets " + off->dump() + " run past the end of the data (" + std::to_string(data_bytes) +
                        " bytes after the header; truncated?)");
    }
    const std::optional<std::uint64_t> want = MulChecked(numel, TensorDTypeSize(*dtype));
    if (!want || *want != end - begin) {
      return bad_tensor("holds " + std::to_string(end - begin) + " bytes, but " + dt->get<std::string>() + " " +
                        ShapeToString(view.shape) + " needs " + (want ? std::to_string(*want) : "more than 2^64"));
    }
    view.bytes = {data + begin, static_cast<std::size_t>(end - begin)};
    file->tensors_.emplace(name, std::move(view));
  }
  return std::shared_ptr<const SafetensorsFile>(std::move(file));
}

StatusOr<std::string> SerializeSafetensors(std::span<const NamedTensor> tensors,
                                           const std::map<std::string, std::string>& metadata) {
  std::map<std::string_view, const TensorView*> sorted;
  for (const NamedTensor& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__") return InvalidArgument("tensor name '" + t.name + "' is reserved");
    std::uint64_t numel = 1;
    for (std::int64_t d : t.tensor.shape) {
      if (d < 0) return InvalidArgument("tensor '" + t.name + "' has a negative dimension");
      numel *= static_cast<std::uint64_t>(d);
    }
    if (numel * TensorDTypeSize(t.tensor.dtype) != t.tensor.bytes.size()) {
      return InvalidArgument("tensor '" + t.name + "': " + std::to_string(t.tensor.bytes.size()) +
                             " bytes do not match " + std::string(TensorDTypeName(t.tensor.dtype)) + " " +
                             ShapeToString(t.tensor.shape));
    }
    if (!sorted.emplace(t.name, &t.tensor).second) return InvalidArgument("tensor '" + t.name + "' appears twice");
  }
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
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
  AppendLe64(out, text.size());
  out += text;
  for (const auto& [name, view] : sorted) {
    out.append(reinterpret_cast<const char*>(view->bytes.data()), view->bytes.size());
  }
  return out;
}

Status WriteSafetensors(const std::string& path, std::span<const NamedTensor> tensors,
                        const std::map<std::string, std::string>& metadata) {
  StatusOr<std::string> bytes = SerializeSafetensors(tensors, metadata);
  if (!bytes.ok()) return bytes.status();
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(bytes->data(), static_cast<std::streamsize>(bytes->size()));
    if (!f) return Status(StatusCode::kUnavailable, "cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return Status(StatusCode::kUnavailable, "cannot rename " + tmp + " to " + path + ": " + std::strerror(errno));
  }
  return Status::Ok();
}

}  // namespace epd
