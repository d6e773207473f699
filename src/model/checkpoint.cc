// Opening a checkpoint is four steps, each failing with a message that names
// the file and the field or tensor at fault:
//   1. config.json -> architecture and VisionConfig (defaults for absent
//      fields are the transformers configuration classes' own);
//   2. preprocessor_config.json -> PreprocessConfig, cross-checked against
//      the vision config;
//   3. the weight files: model.safetensors, or every shard the index names
//      (all must exist and hold what the index says they hold), mapped and
//      header-validated by SafetensorsFile;
//   4. the vision tensors: every tensor under the prefix must be one the
//      architecture expects, with the expected shape and a float dtype, and
//      every expected tensor must be there. Then the model id is hashed.
// Nothing outside the vision prefix is read beyond its header entry.
#include "epd/model/checkpoint.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "digest.h"

namespace epd {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr std::string_view kPrefixes[] = {"model.visual.", "visual."};

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

// Defaults: transformers' Qwen2VLVisionConfig, Qwen2_5_VLVisionConfig and
// Qwen3VLVisionConfig (configuration_*.py / modular_*.py).
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
  switch (arch) {
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
  if (!f.status().ok()) return f.status();

  auto bad = [&](const std::string& what) { return InvalidArgument(where + " vision_config: " + what); };
  auto in_range = [](std::int64_t x, std::int64_t lo, std::int64_t hi) { return x >= lo && x <= hi; };
  if (!in_range(v.depth, 1, 1024)) return bad("depth " + std::to_string(v.depth) + " is not in [1, 1024]");
  if (!in_range(v.width, 1, 1 << 16)) return bad("width " + std::to_string(v.width) + " is not in [1, 65536]");
  if (!in_range(v.num_heads, 1, v.width) || v.width % v.num_heads != 0 || v.head_dim() % 4 != 0) {
    return bad("num_heads " + std::to_string(v.num_heads) + " must divide the width " + std::to_string(v.width) +
               " into heads whose size is a multiple of 4 (2D rotary embedding)");
  }
  if (!in_range(v.mlp_hidden, 1, 1 << 20))
    return bad("MLP width " + std::to_string(v.mlp_hidden) + " is not in [1, 2^20]");
  if (!in_range(v.out_hidden, 1, 1 << 20))
    return bad("output width " + std::to_string(v.out_hidden) + " is not in [1, 2^20]");
  if (!in_range(v.in_channels, 1, 16))
    return bad("in_channels " + std::to_string(v.in_channels) + " is not in [1, 16]");
  if (!in_range(v.patch_size, 1, 1024))
    return bad("patch_size " + std::to_string(v.patch_size) + " is not in [1, 1024]");
  if (!in_range(v.temporal_patch_size, 1, 64)) return bad("temporal_patch_size is not in [1, 64]");
  if (!in_range(v.merge_size, 1, 64)) return bad("spatial_merge_size is not in [1, 64]");
  static const std::set<std::string> kActs = {"quick_gelu", "silu", "gelu_pytorch_tanh", "gelu"};
  if (!kActs.count(v.hidden_act)) {
    return bad("hidden_act '" + v.hidden_act + "' is not supported (quick_gelu, silu, gelu_pytorch_tanh, gelu)");
  }
  for (std::int64_t i : v.fullatt_block_indexes) {
    if (!in_range(i, 0, v.depth - 1))
      return bad("fullatt_block_indexes entry " + std::to_string(i) + " is not a block");
  }
  for (std::int64_t i : v.deepstack_visual_indexes) {
    if (!in_range(i, 0, v.depth - 1))
      return bad("deepstack_visual_indexes entry " + std::to_string(i) + " is not a block");
  }
  if (arch == VisionArch::kQwen25VL) {
    const std::int64_t f2 = v.patch_size * v.merge_size;
    if (v.window_size < f2 || v.window_size % f2 != 0) {
      return bad("window_size " + std::to_string(v.window_size) + " must be a positive multiple of patch_size * " +
                 "spatial_merge_size = " + std::to_string(f2));
    }
  }
  if (arch == VisionArch::kQwen3VL) {
    const auto side =
        static_cast<std::int64_t>(std::llround(std::sqrt(static_cast<double>(v.num_position_embeddings))));
    if (v.num_position_embeddings < 1 || side * side != v.num_position_embeddings) {
      return bad("num_position_embeddings " + std::to_string(v.num_position_embeddings) + " is not a square");
    }
  }
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

// The weight files and the tensors the index assigns to each (empty for a
// single model.safetensors).
struct WeightPlan {
  std::vector<std::string> files;
  std::map<std::string, std::string> weight_map;  // tensor -> file
};

StatusOr<WeightPlan> PlanWeights(const fs::path& dir) {
  WeightPlan plan;
  const fs::path index = dir / "model.safetensors.index.json";
  const fs::path single = dir / "model.safetensors";
  std::error_code ec;
  if (fs::is_regular_file(index, ec)) {
    StatusOr<json> j = ReadJson(index);
    if (!j.ok()) return j.status();
    auto wm = j->find("weight_map");
    if (!j->is_object() || wm == j->end() || !wm->is_object()) {
      return InvalidArgument(index.string() + " has no weight_map object");
    }
    std::set<std::string> files;
    for (auto& [name, file] : wm->items()) {
      if (!file.is_string()) return InvalidArgument(index.string() + ": weight_map['" + name + "'] is not a string");
      const std::string f = file.get<std::string>();
      if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..") {
        return InvalidArgument(index.string() + ": weight_map['" + name + "'] = '" + f + "' is not a file name");
      }
      plan.weight_map[name] = f;
      files.insert(f);
    }
    for (const std::string& f : files) {
      if (!fs::is_regular_file(dir / f, ec)) {
        return InvalidArgument(index.string() + " names shard '" + f + "', which does not exist in " + dir.string());
      }
    }
    plan.files.assign(files.begin(), files.end());
    if (plan.files.empty()) return InvalidArgument(index.string() + " lists no tensors");
    return plan;
  }
  if (fs::is_regular_file(single, ec)) {
    plan.files.push_back("model.safetensors");
    return plan;
  }
  return Status(StatusCode::kNotFound,
                "checkpoint " + dir.string() + " has neither model.safetensors nor model.safetensors.index.json");
}

void HashField(internal::Digest& d, std::string_view s) {
  std::uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<std::uint8_t>(static_cast<std::uint64_t>(s.size()) >> (8 * i));
  d.Update(len);
  d.Update({reinterpret_cast<const std::uint8_t*>(s.data()), s.size()});
}

std::string ModelId(VisionArch arch, const std::map<std::string, TensorView, std::less<>>& tensors,
                    const VisionConfig& v) {
  std::unique_ptr<internal::Digest> d = internal::NewSha256();
  HashField(*d, "epd/model-id/v1");
  HashField(*d, VisionArchName(arch));
  for (const auto& [name, t] : tensors) {
    HashField(*d, name);
    HashField(*d, TensorDTypeName(t.dtype));
    HashField(*d, ShapeToString(t.shape));
    HashField(*d, {reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size()});
  }
  HashField(*d, v.Canonical());
  const std::array<std::uint8_t, 32> digest = d->Final();
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id(VisionArchName(arch));
  id += ':';
  for (int i = 0; i < 16; ++i) {
    id += kHex[digest[i] >> 4];
    id += kHex[digest[i] & 0xf];
  }
  return id;
}

std::string JoinInts(const std::vector<std::int64_t>& v) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i > 0) s += ',';
    s += std::to_string(v[i]);
  }
  return s;
}

}  // namespace

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

std::string VisionConfig::Canonical() const {
  return std::string(VisionArchName(arch)) + " depth=" + std::to_string(depth) + " width=" + std::to_string(width) +
         " heads=" + std::to_string(num_heads) + " mlp=" + std::to_string(mlp_hidden) +
         " out=" + std::to_string(out_hidden) + " in=" + std::to_string(in_channels) +
         " patch=" + std::to_string(patch_size) + " temporal=" + std::to_string(temporal_patch_size) +
         " merge=" + std::to_string(merge_size) + " act=" + hidden_act + " window=" + std::to_string(window_size) +
         " fullatt=[" + JoinInts(fullatt_block_indexes) + "] pos=" + std::to_string(num_position_embeddings) +
         " deepstack=[" + JoinInts(deepstack_visual_indexes) + "]";
}

std::vector<TensorSpec> ExpectedVisionTensors(const VisionConfig& v) {
  const std::int64_t d = v.width;
  const std::int64_t merged = d * v.merge_size * v.merge_size;
  std::vector<TensorSpec> out;
  auto add = [&](std::string name, std::vector<std::int64_t> shape) {
    out.push_back({std::move(name), std::move(shape)});
  };
  auto linear = [&](const std::string& name, std::int64_t out_f, std::int64_t in_f) {
    add(name + ".weight", {out_f, in_f});
    add(name + ".bias", {out_f});
  };
  auto norm = [&](const std::string& name, std::int64_t n, bool bias) {
    add(name + ".weight", {n});
    if (bias) add(name + ".bias", {n});
  };
  add("patch_embed.proj.weight", {d, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size});
  const bool layer_norm = v.arch != VisionArch::kQwen25VL;  // Qwen2.5-VL uses RMSNorm (weight only)
  if (v.arch == VisionArch::kQwen3VL) {
    add("patch_embed.proj.bias", {d});
    add("pos_embed.weight", {v.num_position_embeddings, d});
  }
  for (std::int64_t i = 0; i < v.depth; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    norm(b + "norm1", d, layer_norm);
    norm(b + "norm2", d, layer_norm);
    linear(b + "attn.qkv", 3 * d, d);
    linear(b + "attn.proj", d, d);
    switch (v.arch) {
      case VisionArch::kQwen2VL:
        linear(b + "mlp.fc1", v.mlp_hidden, d);
        linear(b + "mlp.fc2", d, v.mlp_hidden);
        break;
      case VisionArch::kQwen25VL:
        linear(b + "mlp.gate_proj", v.mlp_hidden, d);
        linear(b + "mlp.up_proj", v.mlp_hidden, d);
        linear(b + "mlp.down_proj", d, v.mlp_hidden);
        break;
      case VisionArch::kQwen3VL:
        linear(b + "mlp.linear_fc1", v.mlp_hidden, d);
        linear(b + "mlp.linear_fc2", d, v.mlp_hidden);
        break;
    }
  }
  if (v.arch == VisionArch::kQwen3VL) {
    norm("merger.norm", d, true);
    linear("merger.linear_fc1", merged, merged);
    linear("merger.linear_fc2", v.out_hidden, merged);
    for (std::int64_t j = 0; j < v.deepstack_layers(); ++j) {
      const std::string m = "deepstack_merger_list." + std::to_string(j) + ".";
      norm(m + "norm", merged, true);  // use_postshuffle_norm: over the folded width
      linear(m + "linear_fc1", merged, merged);
      linear(m + "linear_fc2", v.out_hidden, merged);
    }
  } else {
    norm("merger.ln_q", d, layer_norm);
    linear("merger.mlp.0", merged, merged);
    linear("merger.mlp.2", v.out_hidden, merged);
  }
  return out;
}

const TensorView* Checkpoint::Tensor(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::int64_t Checkpoint::parameter_count() const {
  std::int64_t n = 0;
  for (const auto& [name, t] : tensors_) n += t.numel();
  return n;
}

StatusOr<std::shared_ptr<const Checkpoint>> OpenCheckpoint(const std::string& dir_str) {
  const fs::path dir(dir_str);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return Status(StatusCode::kNotFound, "checkpoint directory not found: " + dir_str);
  std::shared_ptr<Checkpoint> ck(new Checkpoint());
  ck->dir_ = dir_str;

  // 1. config.json
  const std::string config_path = (dir / "config.json").string();
  StatusOr<json> config = ReadJson(dir / "config.json");
  if (!config.ok()) return config.status();
  if (!config->is_object()) return InvalidArgument(config_path + " is not a JSON object");
  StatusOr<VisionArch> arch = DetectArch(*config, config_path);
  if (!arch.ok()) return arch.status();
  StatusOr<VisionConfig> vision = ParseVisionConfig(*arch, *config, config_path);
  if (!vision.ok()) return vision.status();
  ck->vision_ = std::move(*vision);

  // 2. preprocessor_config.json
  const std::string pre_path = (dir / "preprocessor_config.json").string();
  StatusOr<json> pre = ReadJson(dir / "preprocessor_config.json");
  if (!pre.ok()) return pre.status();
  StatusOr<PreprocessConfig> pcfg = ParsePreprocess(*pre, ck->vision_, pre_path);
  if (!pcfg.ok()) return pcfg.status();
  ck->preprocess_ = *pcfg;

  // 3. weight files
  StatusOr<WeightPlan> plan = PlanWeights(dir);
  if (!plan.ok()) return plan.status();
  std::map<std::string, TensorView, std::less<>> all;  // full name -> view
  std::map<std::string, std::string> where;            // full name -> file
  for (const std::string& f : plan->files) {
    StatusOr<std::shared_ptr<const SafetensorsFile>> file = SafetensorsFile::Open((dir / f).string());
    if (!file.ok()) return file.status();
    for (const auto& [name, view] : (*file)->tensors()) {
      if (auto [it, fresh] = where.emplace(name, f); !fresh) {
        return InvalidArgument("checkpoint " + dir_str + ": tensor '" + name + "' is in both " + it->second + " and " +
                               f);
      }
      all.emplace(name, view);
    }
    ck->files_.push_back(std::move(*file));
  }
  ck->weight_files_ = plan->files;
  for (const auto& [name, file] : plan->weight_map) {
    auto it = where.find(name);
    if (it == where.end() || it->second != file) {
      return InvalidArgument("checkpoint " + dir_str + ": model.safetensors.index.json puts tensor '" + name + "' in " +
                             file + ", which does not hold it");
    }
  }

  // 4. the vision tensors
  std::string prefix;
  for (std::string_view p : kPrefixes) {
    auto it = all.lower_bound(p);
    if (it != all.end() && it->first.starts_with(p)) {
      if (!prefix.empty()) {
        return InvalidArgument("checkpoint " + dir_str +
                               " holds vision tensors under both 'model.visual.' and "
                               "'visual.'; expected one");
      }
      prefix = p;
    }
  }
  if (prefix.empty()) {
    return InvalidArgument("checkpoint " + dir_str + " holds no vision tensors ('visual.*' or 'model.visual.*')");
  }
  ck->prefix_ = prefix;
  std::map<std::string, std::vector<std::int64_t>> expected;
  for (TensorSpec& s : ExpectedVisionTensors(ck->vision_)) expected.emplace(std::move(s.name), std::move(s.shape));
  const std::string arch_name(VisionArchName(*arch));
  for (auto it = all.lower_bound(prefix); it != all.end() && it->first.starts_with(prefix); ++it) {
    const std::string name = it->first.substr(prefix.size());
    auto e = expected.find(name);
    if (e == expected.end()) {
      return InvalidArgument("checkpoint " + dir_str + ": unexpected tensor '" + it->first + "' (not part of a " +
                             arch_name + " vision tower with this config.json)");
    }
    const TensorView& t = it->second;
    if (t.shape != e->second) {
      return InvalidArgument("checkpoint " + dir_str + ": tensor '" + it->first + "' has shape " +
                             ShapeToString(t.shape) + ", expected " + ShapeToString(e->second) + " from config.json");
    }
    if (t.dtype != TensorDType::kF32 && t.dtype != TensorDType::kF16 && t.dtype != TensorDType::kBF16) {
      return InvalidArgument("checkpoint " + dir_str + ": tensor '" + it->first + "' has dtype " +
                             std::string(TensorDTypeName(t.dtype)) + "; vision tensors must be F32, F16 or BF16");
    }
    ck->tensors_.emplace(name, t);
  }
  for (const auto& [name, shape] : expected) {
    if (!ck->tensors_.count(name)) {
      return InvalidArgument("checkpoint " + dir_str + ": missing tensor '" + prefix + name + "' (" +
                             ShapeToString(shape) + ") of the " + arch_name + " vision tower");
    }
  }
  ck->model_id_ = ModelId(*arch, ck->tensors_, ck->vision_);
  return std::shared_ptr<const Checkpoint>(std::move(ck));
}

std::string DescribeCheckpoint(const Checkpoint& c) {
  const VisionConfig& v = c.vision();
  const PreprocessConfig& p = c.preprocess();
  std::ostringstream o;
  auto floats = [](const std::array<float, 3>& a) {
    std::ostringstream s;
    s << "[" << a[0] << ", " << a[1] << ", " << a[2] << "]";
    return s.str();
  };
  std::map<std::string, std::int64_t> dtypes;
  for (const auto& [name, t] : c.tensors()) dtypes[std::string(TensorDTypeName(t.dtype))] += t.numel();
  std::string dtype_text;
  for (const auto& [name, n] : dtypes) {
    if (!dtype_text.empty()) dtype_text += ", ";
    dtype_text += name + " " + std::to_string(n);
  }
  o << "checkpoint:       " << c.dir() << "\n"
    << "architecture:     " << VisionArchName(v.arch) << "\n"
    << "weights:          ";
  for (std::size_t i = 0; i < c.weight_files().size(); ++i) o << (i ? ", " : "") << c.weight_files()[i];
  o << " (vision tensors under '" << c.prefix() << "')\n"
    << "vision tower:     " << c.tensors().size() << " tensors, " << c.parameter_count() << " parameters ("
    << dtype_text << ")\n"
    << "blocks:           " << v.depth << " x width " << v.width << ", " << v.num_heads << " heads of " << v.head_dim()
    << ", MLP " << v.mlp_hidden << " (" << v.hidden_act << ")\n";
  if (v.arch == VisionArch::kQwen25VL) {
    o << "window attention: " << v.window_size << " px (" << v.window_size / v.patch_size << "x"
      << v.window_size / v.patch_size << " patches); full attention in blocks [" << JoinInts(v.fullatt_block_indexes)
      << "]\n";
  }
  o << "hidden size:      " << v.out_hidden << " (output width per token)\n"
    << "deepstack layers: " << v.deepstack_layers();
  if (v.deepstack_layers() > 0) o << " (after blocks [" << JoinInts(v.deepstack_visual_indexes) << "])";
  o << "\n"
    << "preprocessing:    patch " << p.patch_size << ", merge " << p.merge_size << " (factor " << p.factor()
    << "), temporal patch " << p.temporal_patch_size << ", pixels [" << p.min_pixels << ", " << p.max_pixels
    << "], mean " << floats(p.mean) << ", std " << floats(p.std) << ", "
    << (p.resample == Resample::kBicubic ? "bicubic" : "bilinear") << "; patch_dim " << p.patch_dim() << "\n"
    << "model id:         " << c.model_id() << "\n";
  return o.str();
}

}  // namespace epd
