// LoadModel: --model's one decision, by what the path is. Kept out of the
// torch translation units: it only calls the two loaders.
#include <filesystem>

#include "epd/checkpoint_tower/checkpoint_tower.h"
#include "epd/torch_tower/torch_tower.h"

namespace epd {

StatusOr<LoadedModel> LoadModel(const ModelOptions& options) {
  namespace fs = std::filesystem;
  std::error_code ec;
  LoadedModel loaded;
  if (fs::is_directory(options.path, ec)) {
    StatusOr<std::shared_ptr<const Checkpoint>> ck = OpenCheckpoint(options.path);
    if (!ck.ok()) return ck.status();
    CheckpointTowerOptions t;
    static_cast<TowerRuntimeOptions&>(t) = options;
    loaded.kind = "checkpoint";
    loaded.preprocess = (*ck)->preprocess();
    loaded.model_id = (*ck)->model_id();
    StatusOr<std::unique_ptr<VisionTower>> tower = LoadCheckpointTower(*ck, t);
    if (!tower.ok()) return tower.status();
    loaded.tower = std::move(*tower);
    return loaded;
  }
  if (fs::is_regular_file(options.path, ec)) {
    TorchTowerOptions t;
    t.model_path = options.path;
    static_cast<TowerRuntimeOptions&>(t) = options;
    StatusOr<std::unique_ptr<VisionTower>> tower = LoadTorchScriptTower(t);
    if (!tower.ok()) return tower.status();
    loaded.kind = "torchscript";
    loaded.tower = std::move(*tower);
    return loaded;
  }
  return Status(StatusCode::kNotFound,
                "model not found: '" + options.path + "' is neither a checkpoint directory nor a TorchScript file");
}

}  // namespace epd
