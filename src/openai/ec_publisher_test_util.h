// src/openai/ec_publisher_test_util.h (tests only): what the EcPublisher
// tests share: a temporary directory, embeddings with recognisable rows,
// and a published file read back through the safetensors parser.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "epd/openai/ec_publisher.h"
#include "epd/safetensors/safetensors_codec.h"
#include "gtest/gtest.h"

namespace epd::ec_test {

struct TempDir {
  TempDir() {
    char tmpl[] = "/tmp/ec_publisher_test.XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string path;
};

// tokens x hidden floats main[r][c] = base + r * 100 + c, and `layers`
// deepstack levels deep[r][l * hidden + c] = base + 10000 * (l + 1) + r * 100 + c.
inline Embedding Rows(std::int64_t tokens, std::int64_t hidden, std::int64_t layers, float base) {
  Embedding e;
  e.tokens = tokens;
  e.hidden = hidden;
  e.deepstack_layers = layers;
  e.dtype = DType::kFloat32;
  e.grid = GridTHW{1, 2, 2};
  std::vector<float> main, deep;
  for (std::int64_t r = 0; r < tokens; ++r) {
    for (std::int64_t c = 0; c < hidden; ++c) main.push_back(base + static_cast<float>(r * 100 + c));
    for (std::int64_t l = 0; l < layers; ++l) {
      for (std::int64_t c = 0; c < hidden; ++c)
        deep.push_back(base + static_cast<float>(10000 * (l + 1) + r * 100 + c));
    }
  }
  // memcpy from an empty vector's data() (null) is undefined even for 0 bytes.
  e.main.resize(main.size() * 4);
  if (!main.empty()) std::memcpy(e.main.data(), main.data(), e.main.size());
  e.deepstack.resize(deep.size() * 4);
  if (!deep.empty()) std::memcpy(e.deepstack.data(), deep.data(), e.deepstack.size());
  return e;
}

inline std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A published file as its consumer sees it: the one tensor's shape and
// floats, and the metadata. shape is empty when the file does not parse.
struct ReadBack {
  std::vector<std::int64_t> shape;
  std::vector<float> rows;
  std::map<std::string, std::string> metadata;
};

inline ReadBack Read(const std::string& path) {
  const std::string bytes = Slurp(path);
  ReadBack out;
  StatusOr<ParsedSafetensors> p = ParseSafetensors(std::as_bytes(std::span(bytes)), path);
  if (!p.ok() || p->tensors.count("ec_cache") == 0) return out;
  const TensorView& t = p->tensors.at("ec_cache");
  out.shape = t.shape;
  out.rows.resize(t.bytes.size() / 4);
  if (!t.bytes.empty()) std::memcpy(out.rows.data(), t.bytes.data(), t.bytes.size());
  out.metadata = p->metadata;
  return out;
}

// The main rows of Rows(tokens, hidden, 0, base), as Read gives them.
inline std::vector<float> MainRows(std::int64_t tokens, std::int64_t hidden, float base) {
  std::vector<float> out;
  for (std::int64_t r = 0; r < tokens; ++r) {
    for (std::int64_t c = 0; c < hidden; ++c) out.push_back(base + static_cast<float>(r * 100 + c));
  }
  return out;
}

inline std::unique_ptr<EcPublisher> OpenOrDie(EcPublisherOptions o) {
  auto p = EcPublisher::Open(std::move(o));
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p.ok() ? std::move(*p) : nullptr;
}

inline bool IsRegular(const std::string& path) {
  struct stat st {};
  return lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace epd::ec_test
