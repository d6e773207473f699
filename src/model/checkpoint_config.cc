// The checkpoint's JSON files read as configurations (checkpoint_config.h).
// Defaults for absent fields are the transformers configuration classes'
// own; every error names the file and the field.
#include "checkpoint_config.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

namespace epd {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

struct ArchName {
  VisionArch arch;
  std::string_view model_type;
  std::string_view architectures[2];
};

constexpr ArchName kArchs[] = {
    {VisionArch::kQwen2VL, "qwen2_vl", {"Qwen2VLForConditionalGeneration", "Qwen2VLModel"}},
    {VisionArch::kQwen25VL, "qwen2_5_vl", {"Qwen2_5_VLForConditionalGeneration", "Qwen2_5_VLModel"}},
    {VisionArch::kQwen3VL, "qwen3_vl", {"Qwen3VLForConditionalGeneration", "Qwen3VLModel"}},
};

// Reads typed fields of one JSON object, remembering the first error.
class Fields {
 public:
  Fields(const json& obj, std::string where) : obj_(obj), where_(std::move(where)) {}

  std::int64_t Int(std::string_view key, std::int64_t fallback) {
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null()) return fallback;
    if (!it->is_number_integer()) {
      Fail(std::string(key) + " must be an integer, got " + it->dump());
      return fallback;
    }
    return it->get<std::int64_t>();
  }
  double Number(std::string_view key, double fallback) {
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null()) return fallback;
    if (!it->is_number()) {
      Fail(std::string(key) + " must be a number, got " + it->dump());
      return fallback;
    }
    return it->get<double>();
  }
  std::string Text(std::string_view key, std::string fallback) {
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null()) return fallback;
    if (!it->is_string()) {
      Fail(std::string(key) + " must be a string, got " + it->dump());
      return fallback;
    }
    return it->get<std::string>();
  }
  std::vector<std::int64_t> Ints(std::string_view key, std::vector<std::int64_t> fallback) {
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null()) return fallback;
    std::vector<std::int64_t> out;
    if (it->is_array()) {
      for (const json& v : *it) {
        if (!v.is_number_integer()) break;
        out.push_back(v.get<std::int64_t>());
      }
      if (out.size() == it->size()) return out;
    }
    Fail(std::string(key) + " must be a list of integers, got " + it->dump());
    return fallback;
  }
  // A 3-element list of numbers (image_mean / image_std).
  std::array<float, 3> Floats3(std::string_view key, std::array<float, 3> fallback) {
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null()) return fallback;
    if (it->is_array() && it->size() == 3 &&
        std::all_of(it->begin(), it->end(), [](const json& v) { return v.is_number(); })) {
      return {(*it)[0].get<float>(), (*it)[1].get<float>(), (*it)[2].get<float>()};
    }
    Fail(std::string(key) + " must be a list of 3 numbers, got " + it->dump());
    return fallback;
  }
  void Fail(const std::string& what) {
    if (status_.ok()) status_ = InvalidArgument(where_ + ": " + what);
  }
  const Status& status() const { return status_; }

 private:
  const json& obj_;
  std::string where_;
  Status status_;
};

}  // namespace

namespace internal {

StatusOr<json> ReadJson(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    return Status(StatusCode::kNotFound, "checkpoint file not found: " + path.string());
  std::ifstream f(path, std::ios::binary);
  if (!f) return Status(StatusCode::kUnavailable, "cannot read " + path.string());
  std::stringstream ss;
  ss << f.rdbuf();
  try {
    return json::parse(ss.str());
  } catch (const json::exception& e) {
    return InvalidArgument(path.string() + " is not valid JSON: " + e.what());
  }
}

StatusOr<VisionArch> DetectArch(const json& config, const std::string& where) {
  if (auto it = config.find("model_type"); it != config.end() && it->is_string()) {
    const std::string type = it->get<std::string>();
    for (const ArchName& a : kArchs) {
      if (a.model_type == type) return a.arch;
    }
    return InvalidArgument(where + ": model_type '" + type +
                           "' is not supported (supported: " + SupportedVisionArchs() + ")");
  }
  if (auto it = config.find("architectures"); it != config.end() && it->is_array()) {
    std::string seen;
    for (const json& name : *it) {
      if (!name.is_string()) continue;
      const std::string n = name.get<std::string>();
      for (const ArchName& a : kArchs) {
        if (n == a.architectures[0] || n == a.architectures[1]) return a.arch;
      }
      if (!seen.empty()) seen += ", ";
      seen += n;
    }
    return InvalidArgument(where + ": architectures [" + seen +
                           "] are not supported (supported model types: " + SupportedVisionArchs() + ")");
  }
  return InvalidArgument(
      where + " has neither model_type nor architectures (supported model types: " + SupportedVisionArchs() + ")");
}

namespace {

// The fields each architecture reads, with transformers' defaults
// (Qwen2VLVisionConfig, Qwen2_5_VLVisionConfig, Qwen3VLVisionConfig in
// configuration_*.py / modular_*.py).
void ReadArchFields(Fields& f, VisionConfig& v) {
  switch (v.arch) {
    case VisionArch::kQwen2VL: {
      v.depth = f.Int("depth", 32);
      v.width = f.Int("embed_dim", 1280);
      v.out_hidden = f.Int("hidden_size", 3584);
      const double ratio = f.Number("mlp_ratio", 4.0);
      v.mlp_hidden = static_cast<std::int64_t>(static_cast<double>(v.width) * ratio);  // int() truncates, as in Python
      v.hidden_act = f.Text("hidden_act", "quick_gelu");
      v.patch_size = f.Int("patch_size", 14);
      break;
    }
    case VisionArch::kQwen25VL:
      v.depth = f.Int("depth", 32);
      v.width = f.Int("hidden_size", 3584);
      v.mlp_hidden = f.Int("intermediate_size", 3420);
      v.out_hidden = f.Int("out_hidden_size", 3584);
      v.hidden_act = f.Text("hidden_act", "silu");
      v.patch_size = f.Int("patch_size", 14);
      v.window_size = f.Int("window_size", 112);
      v.fullatt_block_indexes = f.Ints("fullatt_block_indexes", {7, 15, 23, 31});
      break;
    case VisionArch::kQwen3VL:
      v.depth = f.Int("depth", 27);
      v.width = f.Int("hidden_size", 1152);
      v.mlp_hidden = f.Int("intermediate_size", 4304);
      v.out_hidden = f.Int("out_hidden_size", 3584);
      v.hidden_act = f.Text("hidden_act", "gelu_pytorch_tanh");
      v.patch_size = f.Int("patch_size", 16);
      v.num_position_embeddings = f.Int("num_position_embeddings", 2304);
      v.deepstack_visual_indexes = f.Ints("deepstack_visual_indexes", {8, 16, 24});
      break;
  }
}

bool InRange(std::int64_t x, std::int64_t lo, std::int64_t hi) { return x >= lo && x <= hi; }

// The sizes every architecture shares; an empty string when all are in range.
std::string BadSize(const VisionConfig& v) {
  if (!InRange(v.depth, 1, 1024)) return "depth " + std::to_string(v.depth) + " is not in [1, 1024]";
  if (!InRange(v.width, 1, 1 << 16)) return "width " + std::to_string(v.width) + " is not in [1, 65536]";
  if (!InRange(v.num_heads, 1, v.width) || v.width % v.num_heads != 0 || v.head_dim() % 4 != 0) {
    return "num_heads " + std::to_string(v.num_heads) + " must divide the width " + std::to_string(v.width) +
           " into heads whose size is a multiple of 4 (2D rotary embedding)";
  }
  if (!InRange(v.mlp_hidden, 1, 1 << 20)) return "MLP width " + std::to_string(v.mlp_hidden) + " is not in [1, 2^20]";
  if (!InRange(v.out_hidden, 1, 1 << 20)) {
    return "output width " + std::to_string(v.out_hidden) + " is not in [1, 2^20]";
  }
  if (!InRange(v.in_channels, 1, 16)) return "in_channels " + std::to_string(v.in_channels) + " is not in [1, 16]";
  if (!InRange(v.patch_size, 1, 1024)) return "patch_size " + std::to_string(v.patch_size) + " is not in [1, 1024]";
  if (!InRange(v.temporal_patch_size, 1, 64)) return "temporal_patch_size is not in [1, 64]";
  if (!InRange(v.merge_size, 1, 64)) return "spatial_merge_size is not in [1, 64]";
  return "";
}

// The activation, the block indexes and each architecture's own fields;
// an empty string when all are valid.
std::string BadLayout(const VisionConfig& v) {
  static const std::set<std::string> kActs = {"quick_gelu", "silu", "gelu_pytorch_tanh", "gelu"};
  if (!kActs.count(v.hidden_act)) {
    return "hidden_act '" + v.hidden_act + "' is not supported (quick_gelu, silu, gelu_pytorch_tanh, gelu)";
  }
  for (std::int64_t i : v.fullatt_block_indexes) {
    if (!InRange(i, 0, v.depth - 1)) return "fullatt_block_indexes entry " + std::to_string(i) + " is not a block";
  }
  for (std::int64_t i : v.deepstack_visual_indexes) {
    if (!InRange(i, 0, v.depth - 1)) return "deepstack_visual_indexes entry " + std::to_string(i) + " is not a block";
  }
  if (v.arch == VisionArch::kQwen25VL) {
    const std::int64_t f2 = v.patch_size * v.merge_size;
    if (v.window_size < f2 || v.window_size % f2 != 0) {
      return "window_size " + std::to_string(v.window_size) + " must be a positive multiple of patch_size * " +
             "spatial_merge_size = " + std::to_string(f2);
    }
  }
  if (v.arch == VisionArch::kQwen3VL) {
    const auto side =
        static_cast<std::int64_t>(std::llround(std::sqrt(static_cast<double>(v.num_position_embeddings))));
    if (v.num_position_embeddings < 1 || side * side != v.num_position_embeddings) {
      return "num_position_embeddings " + std::to_string(v.num_position_embeddings) + " is not a square";
    }
  }
  return "";
}

}  // namespace

// Defaults: ReadArchFields.
StatusOr<VisionConfig> ParseVisionConfig(VisionArch arch, const json& config, const std::string& where) {
  auto vc = config.find("vision_config");
  if (vc == config.end() || !vc->is_object()) return InvalidArgument(where + " has no vision_config object");
  Fields f(*vc, where + " vision_config");
  VisionConfig v;
  v.arch = arch;
  v.in_channels = f.Int("in_channels", f.Int("in_chans", 3));
  v.temporal_patch_size = f.Int("temporal_patch_size", 2);
  v.merge_size = f.Int("spatial_merge_size", 2);
  v.num_heads = f.Int("num_heads", 16);
  ReadArchFields(f, v);
  if (!f.status().ok()) return f.status();
  std::string bad = BadSize(v);
  if (bad.empty()) bad = BadLayout(v);
  if (!bad.empty()) return InvalidArgument(where + " vision_config: " + bad);
  return v;
}

// See the header comment for precedence; PIL numbering for resample.
StatusOr<PreprocessConfig> ParsePreprocess(const json& pre, const VisionConfig& v, const std::string& where) {
  if (!pre.is_object()) return InvalidArgument(where + " is not a JSON object");
  Fields f(pre, where);
  PreprocessConfig cfg;
  cfg.patch_size = static_cast<int>(f.Int("patch_size", v.patch_size));
  cfg.merge_size = static_cast<int>(f.Int("merge_size", v.merge_size));
  cfg.temporal_patch_size = static_cast<int>(f.Int("temporal_patch_size", v.temporal_patch_size));
  if (auto size = pre.find("size"); size != pre.end() && size->is_object()) {
    Fields s(*size, where + " size");
    cfg.min_pixels = s.Int("shortest_edge", s.Int("min_pixels", cfg.min_pixels));
    cfg.max_pixels = s.Int("longest_edge", s.Int("max_pixels", cfg.max_pixels));
    if (!s.status().ok()) return s.status();
  }
  cfg.min_pixels = f.Int("min_pixels", cfg.min_pixels);
  cfg.max_pixels = f.Int("max_pixels", cfg.max_pixels);
  cfg.mean = f.Floats3("image_mean", cfg.mean);
  cfg.std = f.Floats3("image_std", cfg.std);
  const std::int64_t resample = f.Int("resample", 3);
  if (!f.status().ok()) return f.status();
  if (resample == 3) {
    cfg.resample = Resample::kBicubic;
  } else if (resample == 2) {
    cfg.resample = Resample::kBilinear;
  } else {
    return InvalidArgument(where + ": resample " + std::to_string(resample) +
                           " is not supported (2 bilinear, 3 bicubic, in PIL's numbering)");
  }
  if (cfg.patch_size != v.patch_size || cfg.merge_size != v.merge_size ||
      cfg.temporal_patch_size != v.temporal_patch_size) {
    return InvalidArgument(where + ": patch_size/merge_size/temporal_patch_size " + std::to_string(cfg.patch_size) +
                           "/" + std::to_string(cfg.merge_size) + "/" + std::to_string(cfg.temporal_patch_size) +
                           " disagree with config.json's vision_config " + std::to_string(v.patch_size) + "/" +
                           std::to_string(v.merge_size) + "/" + std::to_string(v.temporal_patch_size));
  }
  if (v.in_channels != 3)
    return InvalidArgument(where + ": the vision tower takes " + std::to_string(v.in_channels) +
                           " channels; preprocessing produces RGB (3)");
  if (Status s = cfg.Validate(); !s.ok()) return InvalidArgument(where + ": " + s.message());
  return cfg;
}

}  // namespace internal

std::string_view VisionArchName(VisionArch arch) {
  for (const ArchName& a : kArchs) {
    if (a.arch == arch) return a.model_type;
  }
  return "unknown";
}

std::string SupportedVisionArchs() {
  std::string s;
  for (const ArchName& a : kArchs) {
    if (!s.empty()) s += ", ";
    s += a.model_type;
  }
  return s;
}

}  // namespace epd
