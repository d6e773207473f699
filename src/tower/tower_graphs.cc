// CUDA graphs of the checkpoint tower forward (tower_graphs.h). Built only
// with EPD_TOWER_CUDA (a CUDA libtorch: at::cuda::CUDAGraph).
#include "tower_graphs.h"

#include <ATen/cuda/CUDAGraph.h>
#include <ATen/record_function.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <exception>

#include "torch_common.h"

namespace epd::internal {

struct TowerGraphs::Entry {
  at::cuda::CUDAGraph graph;
  Tensor input;                      // the static input the graph reads
  std::pair<Tensor, Tensor> output;  // the static outputs it writes
  std::shared_ptr<const ForwardMeta> meta;
};

TowerGraphs::TowerGraphs(std::size_t capacity, c10::Device device) : device_(device), cache_(capacity) {}

TowerGraphs::~TowerGraphs() = default;

std::pair<Tensor, Tensor> TowerGraphs::Run(const GridListCache<const ForwardMeta>::Key& key,
                                           std::shared_ptr<const ForwardMeta> meta, const Tensor& host_pixels,
                                           const Forward& forward) {
  if (!disabled_by_.empty()) return forward(host_pixels.to(device_, /*non_blocking=*/true));
  if (std::shared_ptr<Entry> e = cache_.Find(key)) {
    RECORD_USER_SCOPE("epd::tower_graph_replay");
    e->input.copy_(host_pixels, /*non_blocking=*/true);
    e->graph.replay();
    ++replays_;
    return e->output;
  }
  auto entry = std::make_shared<Entry>();
  entry->input = host_pixels.to(device_, /*non_blocking=*/true);
  entry->meta = std::move(meta);
  std::pair<Tensor, Tensor> result = forward(entry->input);  // the warm-up, and this call's result
  torch::cuda::synchronize(device_.index());
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device_.index());
  bool capturing = false;
  try {
    c10::cuda::CUDAStreamGuard guard(side);
#if TORCH_VERSION_MAJOR >= 2
    entry->graph.capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
#else
    entry->graph.capture_begin();
#endif
    capturing = true;
    entry->output = forward(entry->input);
    capturing = false;
    entry->graph.capture_end();
    side.synchronize();
  } catch (const std::exception& e) {
    if (capturing) {
      try {
        entry->graph.capture_end();
      } catch (const std::exception&) {  // the capture is already invalid; nothing to keep
      }
    }
    disabled_by_ = "capture failed: " + TorchMessage(e);
    return result;
  }
  cache_.Insert(key, std::move(entry));
  ++captures_;
  return result;
}

GraphStats TowerGraphs::stats() const {
  GraphStats s;
  s.replays = replays_;
  s.captures = captures_;
  s.cache = cache_.stats();
  s.disabled_by = disabled_by_;
  return s;
}

}  // namespace epd::internal
