#include "fake_tower.h"

#include <cstring>

namespace epd::testing {
namespace {

constexpr std::int64_t kPatchDim = 1176;

float TokenSum(const float* patches, std::int64_t token) {
  float s = 0;
  for (std::int64_t r = 4 * token; r < 4 * token + 4; ++r) {
    for (std::int64_t k = 0; k < 8; ++k) s += patches[r * kPatchDim + k * 147];
  }
  return s;
}

void Put(std::vector<std::byte>& out, float v, DType dtype) {
  std::uint32_t bits;
  std::memcpy(&bits, &v, 4);
  if (dtype == DType::kFloat32) {
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::byte>((bits >> (8 * i)) & 0xff));
    return;
  }
  // bfloat16, round to nearest even (no NaNs arise here).
  const std::uint32_t rounded = bits + 0x7fff + ((bits >> 16) & 1);
  const std::uint16_t half = static_cast<std::uint16_t>(rounded >> 16);
  out.push_back(static_cast<std::byte>(half & 0xff));
  out.push_back(static_cast<std::byte>(half >> 8));
}

// Appends item rows of both halves.
void Emit(const float* patches, std::int64_t tokens, const FakeTowerOptions& o, std::vector<std::byte>& main,
          std::vector<std::byte>& deep) {
  for (std::int64_t t = 0; t < tokens; ++t) {
    const float s = TokenSum(patches, t);
    for (std::int64_t c = 0; c < o.hidden; ++c) Put(main, s + 0.25f * static_cast<float>(c), o.dtype);
    for (std::int64_t l = 0; l < o.deepstack_layers; ++l) {
      for (std::int64_t c = 0; c < o.hidden; ++c) {
        Put(deep, s * static_cast<float>(l + 2) - static_cast<float>(c), o.dtype);
      }
    }
  }
}

}  // namespace

std::int64_t FakeTowerState::items_encoded() const {
  std::lock_guard<std::mutex> lock(gate_mu_);
  std::int64_t n = 0;
  for (const auto& b : batches) n += static_cast<std::int64_t>(b.size());
  return n;
}

void FakeTowerState::Close() {
  std::lock_guard<std::mutex> lock(gate_mu_);
  gate_closed_ = true;
}

void FakeTowerState::Open() {
  {
    std::lock_guard<std::mutex> lock(gate_mu_);
    gate_closed_ = false;
  }
  gate_cv_.notify_all();
}

void FakeTowerState::WaitForEncodes(int n) {
  std::unique_lock<std::mutex> lock(gate_mu_);
  gate_cv_.wait(lock, [&] { return encodes_started_ >= n; });
}

FakeTower::FakeTower(FakeTowerOptions options, std::shared_ptr<FakeTowerState> state)
    : options_(options), state_(std::move(state)) {}

StatusOr<TowerOutput> FakeTower::Encode(std::span<const TowerItem> items) {
  {
    std::unique_lock<std::mutex> lock(state_->gate_mu_);
    ++state_->encodes_started_;
    state_->gate_cv_.notify_all();
    state_->gate_cv_.wait(lock, [&] { return !state_->gate_closed_; });
  }
  std::vector<GridTHW> grids;
  std::vector<float> ids;
  for (const TowerItem& it : items) {
    grids.push_back(it.grid);
    ids.push_back(TokenSum(it.patches, 0));
  }
  {
    std::lock_guard<std::mutex> lock(state_->gate_mu_);
    state_->batches.push_back(grids);
    state_->batch_ids.push_back(ids);
  }
  if (state_->fail_next.has_value()) {
    Status s = *state_->fail_next;
    state_->fail_next.reset();
    return s;
  }
  TowerOutput out;
  out.hidden = options_.hidden;
  out.deepstack_layers = options_.deepstack_layers;
  out.dtype = options_.dtype;
  std::vector<std::byte> deep;
  state_->buffer.clear();
  for (const TowerItem& it : items) {
    const std::int64_t tokens = it.grid.tokens(2);
    Emit(it.patches, tokens, options_, state_->buffer, deep);
    out.tokens += tokens;
  }
  if (state_->extra_rows_next > 0) {
    const std::size_t row = static_cast<std::size_t>(options_.hidden) * DTypeSize(options_.dtype);
    state_->buffer.resize(state_->buffer.size() + row * state_->extra_rows_next, std::byte{0x11});
    deep.resize(deep.size() + row * options_.deepstack_layers * state_->extra_rows_next, std::byte{0x22});
    out.tokens += state_->extra_rows_next;
    state_->extra_rows_next = 0;
  }
  if (options_.output_on_device) {
    // One block, main rows then deepstack rows, freed when the last holder
    // (the worker's batch, or a copy waiting to land) lets go.
    auto block = std::make_shared<std::vector<std::byte>>(state_->buffer);
    block->insert(block->end(), deep.begin(), deep.end());
    const std::size_t main_bytes = state_->buffer.size();
    out.device_main = block->data();
    out.device_deepstack = deep.empty() ? nullptr : block->data() + main_bytes;
    out.device_owner = std::move(block);
    return out;
  }
  out.main = state_->buffer;
  out.deepstack = std::move(deep);
  return out;
}

Embedding FakeTower::Reference(const PreprocessedImage& image, const FakeTowerOptions& options) {
  Embedding e;
  e.tokens = image.tokens();
  e.hidden = options.hidden;
  e.deepstack_layers = options.deepstack_layers;
  e.dtype = options.dtype;
  e.grid = image.grid;
  Emit(image.patches.data(), e.tokens, options, e.main, e.deepstack);
  return e;
}

}  // namespace epd::testing
