// libFuzzer entry point for the safetensors codec
// (epd/safetensors/safetensors_codec.h): the bytes of a checkpoint shard or an
// embedding file, so any bytes. Beyond "no crash, no sanitizer report" it
// checks, and aborts if one breaks:
//   - every failure is kInvalidArgument and starts with the source it was
//     given ("fuzz: ...");
//   - every view of a parsed file lies inside the input, after the header,
//     and holds numel x dtype size bytes; no two non-empty views overlap;
//   - the parsed tensors and metadata, written back with
//     SerializeSafetensors, parse again to the same names, dtypes, shapes,
//     bytes and metadata.
// The same function is linked into safetensors_corpus_replay (any compiler).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "epd/safetensors/safetensors_codec.h"

namespace {

[[noreturn]] void Violated(const char* what, const epd::Status& s) {
  std::fprintf(stderr, "safetensors_fuzzer: invariant violated: %s (%s)\n", what, s.ToString().c_str());
  std::abort();
}

bool SameBytes(std::span<const std::byte> a, std::span<const std::byte> b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end());
}

// Checks every view of `p` against the input [data, data + size).
void CheckViews(const epd::ParsedSafetensors& p, const std::byte* data, std::size_t size) {
  const std::byte* body = data + 8 + p.header.size();
  std::vector<std::pair<const std::byte*, const std::byte*>> ranges;
  for (const auto& [name, t] : p.tensors) {
    const std::byte* b = t.bytes.data();
    if (!t.bytes.empty() && (b < body || b + t.bytes.size() > data + size)) {
      Violated("a view lies outside the data", epd::Status::Ok());
    }
    if (static_cast<std::uint64_t>(t.numel()) * epd::TensorDTypeSize(t.dtype) != t.bytes.size()) {
      Violated("a view's size disagrees with its dtype and shape", epd::Status::Ok());
    }
    if (!t.bytes.empty()) ranges.emplace_back(b, b + t.bytes.size());
  }
  std::sort(ranges.begin(), ranges.end());
  for (std::size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) Violated("two views overlap", epd::Status::Ok());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto* bytes = reinterpret_cast<const std::byte*>(data);
  auto parsed = epd::ParseSafetensors({bytes, size}, "fuzz");
  if (!parsed.ok()) {
    if (parsed.status().code() != epd::StatusCode::kInvalidArgument) {
      Violated("ParseSafetensors failed with a code other than INVALID_ARGUMENT", parsed.status());
    }
    if (parsed.status().message().rfind("fuzz: ", 0) != 0) Violated("error does not name the source", parsed.status());
    return 0;
  }
  CheckViews(*parsed, bytes, size);

  std::vector<epd::NamedTensor> tensors;
  for (const auto& [name, t] : parsed->tensors) tensors.push_back({name, t});
  auto written = epd::SerializeSafetensors(tensors, parsed->metadata);
  if (!written.ok()) Violated("a parsed file's tensors do not serialize", written.status());
  auto again = epd::ParseSafetensors(std::as_bytes(std::span(*written)), "fuzz");
  if (!again.ok()) Violated("SerializeSafetensors' output does not parse", again.status());
  if (again->metadata != parsed->metadata || again->tensors.size() != parsed->tensors.size()) {
    Violated("the written file holds other metadata or tensors", epd::Status::Ok());
  }
  for (const auto& [name, t] : parsed->tensors) {
    auto it = again->tensors.find(name);
    if (it == again->tensors.end() || it->second.dtype != t.dtype || it->second.shape != t.shape ||
        !SameBytes(it->second.bytes, t.bytes)) {
      Violated("a tensor changed through SerializeSafetensors", epd::Status::Ok());
    }
  }
  return 0;
}
