// checkpoint_tower_dump: runs a checkpoint tower on given patch rows and
// writes its outputs, for tests that compare it with a reference written
// elsewhere (Python).
//
//   checkpoint_tower_dump --model DIR --in IN.safetensors --out OUT.safetensors [--threads N]
//
// IN holds "pixel_values" F32 [N, patch_dim] and "grid_thw" I64 [n_items, 3]
// (rows of the items in order, as epd/core/vision_tower.h packs them). OUT gets
// "main" F32 [T, out_hidden] and, only when the tower has deepstack,
// "deepstack" F32 [T, out_hidden * deepstack_layers]. All items run in one
// Encode call. Exit status 0 on success; on any error the message goes to
// stderr and the status is 1.
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "epd/checkpoint_tower/checkpoint_tower.h"
#include "epd/model/safetensors_file.h"
#include "tool_flags.h"

namespace {

int Fail(const std::string& message) {
  std::cerr << "checkpoint_tower_dump: " << message << "\n";
  return 1;
}

// IN's two tensors, checked for dtype and rank. An error's message is what
// Fail prints.
struct DumpInput {
  const epd::TensorView* pixels = nullptr;  // pixel_values F32 [N, patch_dim]
  const epd::TensorView* grids = nullptr;   // grid_thw I64 [n_items, 3]
};

epd::Status FindInputs(const std::string& in, const epd::SafetensorsFile& input, DumpInput* found) {
  const epd::TensorView* pixels = input.Find("pixel_values");
  const epd::TensorView* grids = input.Find("grid_thw");
  if (pixels == nullptr || pixels->dtype != epd::TensorDType::kF32 || pixels->shape.size() != 2) {
    return epd::InvalidArgument(in + ": needs pixel_values F32 [N, patch_dim]");
  }
  if (grids == nullptr || grids->dtype != epd::TensorDType::kI64 || grids->shape.size() != 2 || grids->shape[1] != 3) {
    return epd::InvalidArgument(in + ": needs grid_thw I64 [n_items, 3]");
  }
  *found = {pixels, grids};
  return epd::Status::Ok();
}

// The items: pixel_values' rows copied into `rows` (the mapping's tensor
// data need not be 4- or 8-aligned), then one item per grid_thw row, in
// order, over those rows. An error's message is what Fail prints.
epd::Status PackItems(const std::string& in, const DumpInput& input, std::vector<float>* rows,
                      std::vector<epd::TowerItem>* items) {
  const epd::TensorView& pixels = *input.pixels;
  rows->resize(static_cast<std::size_t>(pixels.numel()));
  std::memcpy(rows->data(), pixels.bytes.data(), pixels.bytes.size());
  std::vector<std::int64_t> g(static_cast<std::size_t>(input.grids->numel()));
  std::memcpy(g.data(), input.grids->bytes.data(), input.grids->bytes.size());
  const std::int64_t patch_dim = pixels.shape[1];
  std::int64_t row = 0;
  for (std::size_t i = 0; i < g.size(); i += 3) {
    epd::TowerItem item;
    item.grid = {g[i], g[i + 1], g[i + 2]};
    item.patch_dim = patch_dim;
    if (g[i] < 1 || g[i + 1] < 1 || g[i + 2] < 1 || item.grid.patches() > pixels.shape[0] - row) {
      return epd::InvalidArgument(in + ": grid_thw row " + std::to_string(i / 3) +
                                  " does not fit the pixel_values rows");
    }
    item.patches = rows->data() + row * patch_dim;
    row += item.grid.patches();
    items->push_back(item);
  }
  if (row != pixels.shape[0]) {
    return epd::InvalidArgument(in + ": grid_thw covers " + std::to_string(row) + " rows, pixel_values has " +
                                std::to_string(pixels.shape[0]));
  }
  return epd::Status::Ok();
}

// OUT: "main", and "deepstack" when the tower has it.
epd::Status WriteOutputs(const std::string& out, const epd::TowerOutput& result) {
  std::vector<epd::NamedTensor> tensors;
  tensors.push_back({"main", {epd::TensorDType::kF32, {result.tokens, result.hidden}, result.main}});
  if (result.deepstack_layers > 0) {
    tensors.push_back(
        {"deepstack",
         {epd::TensorDType::kF32, {result.tokens, result.hidden * result.deepstack_layers}, result.deepstack}});
  }
  return epd::WriteSafetensors(out, tensors);
}

int Run(int argc, char** argv) {
  std::string model, in, out;
  int threads = 1;
  epd::tower_tools::FlagParser flags;
  flags.Text("--model", &model);
  flags.Text("--in", &in);
  flags.Text("--out", &out);
  flags.Int("--threads", 0, &threads);
  if (epd::Status s = flags.Parse(argc, argv); !s.ok()) return Fail(s.message());
  if (model.empty() || in.empty() || out.empty()) {
    return Fail("usage: checkpoint_tower_dump --model DIR --in IN.safetensors --out OUT.safetensors [--threads N]");
  }
  auto input = epd::SafetensorsFile::Open(in);
  if (!input.ok()) return Fail(input.status().ToString());
  DumpInput found;
  if (epd::Status s = FindInputs(in, **input, &found); !s.ok()) return Fail(s.message());

  epd::CheckpointTowerOptions opts;
  opts.dir = model;
  opts.num_threads = threads;
  auto tower = epd::LoadCheckpointTower(opts);
  if (!tower.ok()) return Fail(tower.status().ToString());
  std::vector<float> rows;
  std::vector<epd::TowerItem> items;
  if (epd::Status s = PackItems(in, found, &rows, &items); !s.ok()) return Fail(s.message());
  auto result = (*tower)->Encode(items);
  if (!result.ok()) return Fail(result.status().ToString());
  if (epd::Status s = WriteOutputs(out, *result); !s.ok()) return Fail(s.ToString());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return epd::tower_tools::RunReportingExceptions("checkpoint_tower_dump", Run, argc, argv);
}
