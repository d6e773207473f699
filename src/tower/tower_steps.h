// src/tower/tower_steps.h (tools only, not a library): the named step
// configurations of the tower restructure (docs/GPU.md "Tower restructure"),
// shared by checkpoint_tower_bench and checkpoint_tower_profile so that a
// step means the same options in both. Each step keeps the ones before it:
//   baseline     mlp_fusion, varlen_attention, fused_kernels off,
//                metadata_cache_size 0, cuda_graph_max_batch 0
//   restructure  + mlp_fusion, the metadata cache (the options' size)
//   attention    + varlen_attention
//   fusions      + fused_kernels
//   graphs       + CUDA graphs (the options' cuda_graph_max_batch)
//   default      the options unchanged
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "epd/checkpoint_tower/checkpoint_tower.h"

namespace epd::tower_tools {

// The step names, in order, without "default".
inline const std::vector<std::string>& StepNames() {
  static const std::vector<std::string> kSteps = {"baseline", "restructure", "attention", "fusions", "graphs"};
  return kSteps;
}

// Applies step `name` to `o`; false (and `o` untouched) for an unknown name.
inline bool ApplyStepConfig(const std::string& name, CheckpointTowerOptions* o) {
  if (name == "default") return true;
  const std::vector<std::string>& steps = StepNames();
  const auto it = std::find(steps.begin(), steps.end(), name);
  if (it == steps.end()) return false;
  const auto step = it - steps.begin();
  o->mlp_fusion = step >= 1;
  if (step < 1) o->metadata_cache_size = 0;
  o->varlen_attention = step >= 2;
  o->fused_kernels = step >= 3;
  if (step < 4) o->cuda_graph_max_batch = 0;
  return true;
}

}  // namespace epd::tower_tools
