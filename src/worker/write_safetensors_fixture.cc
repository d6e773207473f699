// Writes a small, fully specified embeddings file for
// safetensors_readback_test.py, which checks it with numpy alone.
//   key 0x11 * 32: f32, 3 tokens, hidden 4, 2 deepstack layers,
//                  main[t][c] = t * 10 + c, deepstack[t][j] = -(t * 100 + j),
//                  grid (t, h, w) = (3, 2, 2): 12 patches, 3 tokens after
//                  the 2x2 merge (a 3-temporal-patch clip)
//   key 0x22 * 32: bf16, 2 tokens, hidden 3, no deepstack,
//                  main[t][c] = bf16(t + c / 2)  (exact in bf16),
//                  grid unknown (no ".grid_thw" tensor, as in older files)
#include <cstdio>
#include <cstring>

#include "epd/worker/safetensors.h"

namespace {

void PutF32(std::vector<std::byte>& out, float v) {
  std::byte b[4];
  std::memcpy(b, &v, 4);
  out.insert(out.end(), b, b + 4);
}

void PutBf16(std::vector<std::byte>& out, float v) {
  std::uint32_t bits;
  std::memcpy(&bits, &v, 4);
  out.push_back(static_cast<std::byte>((bits >> 16) & 0xff));
  out.push_back(static_cast<std::byte>(bits >> 24));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT.safetensors\n", argv[0]);
    return 2;
  }
  auto a = std::make_shared<epd::Embedding>();
  a->tokens = 3;
  a->hidden = 4;
  a->deepstack_layers = 2;
  a->dtype = epd::DType::kFloat32;
  a->grid = {3, 2, 2};
  for (int t = 0; t < 3; ++t) {
    for (int c = 0; c < 4; ++c) PutF32(a->main, static_cast<float>(t * 10 + c));
    for (int j = 0; j < 8; ++j) PutF32(a->deepstack, -static_cast<float>(t * 100 + j));
  }
  auto b = std::make_shared<epd::Embedding>();
  b->tokens = 2;
  b->hidden = 3;
  b->dtype = epd::DType::kBFloat16;
  for (int t = 0; t < 2; ++t) {
    for (int c = 0; c < 3; ++c) PutBf16(b->main, static_cast<float>(t) + static_cast<float>(c) / 2);
  }
  epd::ContentKey ka, kb;
  ka.bytes.fill(0x11);
  kb.bytes.fill(0x22);
  std::vector<epd::KeyedEmbedding> entries = {{kb, b}, {ka, a}};
  epd::Status s = epd::WriteEmbeddingsSafetensors(argv[1], entries, {{"model_id", "fixture"}});
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
