// Test helpers for the GPU tier: embeddings with deterministic bytes, built
// without the code under test, and a byte-exact comparison.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "epd/core/embedding.h"

namespace epd::testing_util {

// A splitmix64 step per byte: cheap, and neighbouring seeds share no bytes.
inline std::byte PayloadByte(std::uint64_t seed, std::size_t i) {
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + i + 1;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return static_cast<std::byte>((x ^ (x >> 31)) & 0xff);
}

// tokens x hidden main rows and tokens x (hidden * layers) deepstack rows,
// every byte a function of (seed, half, index).
inline EmbeddingPtr MakeEmbedding(std::uint64_t seed, std::int64_t tokens = 16, std::int64_t hidden = 64,
                                  std::int64_t layers = 1, DType dtype = DType::kFloat32) {
  auto e = std::make_shared<Embedding>();
  e->tokens = tokens;
  e->hidden = hidden;
  e->deepstack_layers = layers;
  e->dtype = dtype;
  e->main.resize(static_cast<std::size_t>(tokens * hidden) * DTypeSize(dtype));
  e->deepstack.resize(e->main.size() * static_cast<std::size_t>(layers));
  for (std::size_t i = 0; i < e->main.size(); ++i) e->main[i] = PayloadByte(2 * seed, i);
  for (std::size_t i = 0; i < e->deepstack.size(); ++i) e->deepstack[i] = PayloadByte(2 * seed + 1, i);
  return e;
}

// Whether `got` equals MakeEmbedding(seed, ...) with the same shape, byte for byte.
inline ::testing::AssertionResult SameAsSeed(const Embedding& got, std::uint64_t seed) {
  const EmbeddingPtr want = MakeEmbedding(seed, got.tokens, got.hidden, got.deepstack_layers, got.dtype);
  if (got.main.size() != want->main.size() || got.deepstack.size() != want->deepstack.size()) {
    return ::testing::AssertionFailure() << "sizes differ: main " << got.main.size() << " vs " << want->main.size()
                                         << ", deepstack " << got.deepstack.size() << " vs " << want->deepstack.size();
  }
  for (std::size_t i = 0; i < got.main.size(); ++i) {
    if (got.main[i] != want->main[i]) {
      return ::testing::AssertionFailure() << "main byte " << i << " is " << static_cast<int>(got.main[i])
                                           << ", expected " << static_cast<int>(want->main[i]);
    }
  }
  for (std::size_t i = 0; i < got.deepstack.size(); ++i) {
    if (got.deepstack[i] != want->deepstack[i]) {
      return ::testing::AssertionFailure() << "deepstack byte " << i << " is " << static_cast<int>(got.deepstack[i])
                                           << ", expected " << static_cast<int>(want->deepstack[i]);
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace epd::testing_util
