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

#include "checkpoint_config.h"
#include "digest.h"

namespace epd {
namespace {

using internal::DetectArch;
using internal::ParsePreprocess;
using internal::ParseVisionConfig;
using internal::ReadJson;
using nlohmann::json;
namespace fs = std::filesystem;

constexpr std::string_view kPrefixes[] = {"model.visual.", "visual."};

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
        // NOLINTNEXTLINE(performance-inefficient-string-concatenation): built once, for the error returned
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

namespace {

using TensorMap = std::map<std::string, TensorView, std::less<>>;

// config.json: the architecture and the vision tower's config.
StatusOr<std::pair<VisionArch, VisionConfig>> ReadVisionConfig(const fs::path& dir) {
  const std::string config_path = (dir / "config.json").string();
  StatusOr<json> config = ReadJson(dir / "config.json");
  if (!config.ok()) return config.status();
  if (!config->is_object()) return InvalidArgument(config_path + " is not a JSON object");
  StatusOr<VisionArch> arch = DetectArch(*config, config_path);
  if (!arch.ok()) return arch.status();
  StatusOr<VisionConfig> vision = ParseVisionConfig(*arch, *config, config_path);
  if (!vision.ok()) return vision.status();
  return std::pair{*arch, std::move(*vision)};
}

// The weight files, mapped, and every tensor in them by full name; a tensor
// in two files, or not where the index puts it, is refused.
StatusOr<TensorMap> OpenWeights(const fs::path& dir, const std::string& dir_str, const WeightPlan& plan,
                                std::vector<std::shared_ptr<const SafetensorsFile>>& files) {
  TensorMap all;                             // full name -> view
  std::map<std::string, std::string> where;  // full name -> file
  for (const std::string& f : plan.files) {
    StatusOr<std::shared_ptr<const SafetensorsFile>> file = SafetensorsFile::Open((dir / f).string());
    if (!file.ok()) return file.status();
    for (const auto& [name, view] : (*file)->tensors()) {
      if (auto [it, fresh] = where.emplace(name, f); !fresh) {
        // NOLINTNEXTLINE(performance-inefficient-string-concatenation): built once, for the error returned
        return InvalidArgument("checkpoint " + dir_str + ": tensor '" + name + "' is in both " + it->second + " and " +
                               f);
      }
      all.emplace(name, view);
    }
    files.push_back(std::move(*file));
  }
  for (const auto& [name, file] : plan.weight_map) {
    auto it = where.find(name);
    if (it == where.end() || it->second != file) {
      // NOLINTNEXTLINE(performance-inefficient-string-concatenation): built once, for the error returned
      return InvalidArgument("checkpoint " + dir_str + ": model.safetensors.index.json puts tensor '" + name + "' in " +
                             file + ", which does not hold it");
    }
  }
  return all;
}

// The one prefix the vision tensors are under (kPrefixes).
StatusOr<std::string> VisionPrefix(const TensorMap& all, const std::string& dir_str) {
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
  return prefix;
}

// The vision tensors by name without the prefix: exactly the ones
// config.json implies, of their shapes, in a float dtype.
StatusOr<TensorMap> VisionTensors(const TensorMap& all, const std::string& prefix, VisionArch arch,
                                  const VisionConfig& vision, const std::string& dir_str) {
  std::map<std::string, std::vector<std::int64_t>> expected;
  for (TensorSpec& s : ExpectedVisionTensors(vision)) expected.emplace(std::move(s.name), std::move(s.shape));
  const std::string arch_name(VisionArchName(arch));
  TensorMap out;
  for (auto it = all.lower_bound(prefix); it != all.end() && it->first.starts_with(prefix); ++it) {
    const std::string name = it->first.substr(prefix.size());
    auto e = expected.find(name);
    if (e == expected.end()) {
      // NOLINTNEXTLINE(performance-inefficient-string-concatenation): built once, for the error returned
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
    out.emplace(name, t);
  }
  for (const auto& [name, shape] : expected) {
    if (!out.count(name)) {
      // NOLINTBEGIN(performance-inefficient-string-concatenation): built once, for the error returned
      return InvalidArgument("checkpoint " + dir_str + ": missing tensor '" + prefix + name + "' (" +
                             ShapeToString(shape) + ") of the " + arch_name + " vision tower");
      // NOLINTEND(performance-inefficient-string-concatenation)
    }
  }
  return out;
}

}  // namespace

StatusOr<std::shared_ptr<const Checkpoint>> OpenCheckpoint(const std::string& dir_str) {
  const fs::path dir(dir_str);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return Status(StatusCode::kNotFound, "checkpoint directory not found: " + dir_str);
  std::shared_ptr<Checkpoint> ck(new Checkpoint());
  ck->dir_ = dir_str;
  StatusOr<std::pair<VisionArch, VisionConfig>> config = ReadVisionConfig(dir);
  if (!config.ok()) return config.status();
  const VisionArch arch = config->first;
  ck->vision_ = std::move(config->second);
  const std::string pre_path = (dir / "preprocessor_config.json").string();
  StatusOr<json> pre = ReadJson(dir / "preprocessor_config.json");
  if (!pre.ok()) return pre.status();
  StatusOr<PreprocessConfig> pcfg = ParsePreprocess(*pre, ck->vision_, pre_path);
  if (!pcfg.ok()) return pcfg.status();
  ck->preprocess_ = *pcfg;
  StatusOr<WeightPlan> plan = PlanWeights(dir);
  if (!plan.ok()) return plan.status();
  StatusOr<TensorMap> all = OpenWeights(dir, dir_str, *plan, ck->files_);
  if (!all.ok()) return all.status();
  ck->weight_files_ = plan->files;
  StatusOr<std::string> prefix = VisionPrefix(*all, dir_str);
  if (!prefix.ok()) return prefix.status();
  ck->prefix_ = *prefix;
  StatusOr<TensorMap> tensors = VisionTensors(*all, *prefix, arch, ck->vision_, dir_str);
  if (!tensors.ok()) return tensors.status();
  ck->tensors_ = std::move(*tensors);
  ck->model_id_ = ModelId(arch, ck->tensors_, ck->vision_);
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
