// epd/model/checkpoint.h: a Hugging Face Qwen-VL checkpoint directory, opened for
// its vision tower only.
//
// A Hugging Face checkpoint holds the whole model: for Qwen2.5-VL-7B about
// 15 GB, of which the vision tower is about 1.3 GB. OpenCheckpoint reads
// config.json and preprocessor_config.json, maps the weight files
// (model.safetensors, or the shards listed in model.safetensors.index.json)
// and exposes the vision tower's tensors as read-only views into the
// mappings. The language model's bytes are never read: the mappings page in
// only what is touched, and only vision tensors are touched (to hash them for
// the model id, and by the tower that converts them once).
//
// Architectures (config.json "model_type", else "architectures"):
//   qwen2_vl    Qwen2VLForConditionalGeneration     tensors "visual.*"
//   qwen2_5_vl  Qwen2_5_VLForConditionalGeneration  tensors "visual.*"
//   qwen3_vl    Qwen3VLForConditionalGeneration     tensors "model.visual.*"
// Each accepts either prefix ("visual." or "model.visual."); a checkpoint
// with vision tensors under both is rejected. The expected tensor names and
// shapes follow transformers/models/{qwen2_vl,qwen2_5_vl,qwen3_vl}/
// modeling_*.py (Qwen2VisionTransformerPretrainedModel,
// Qwen2_5_VisionTransformerPretrainedModel, Qwen3VLVisionModel); missing
// vision_config fields take those classes' configuration defaults.
//
// Preprocessing comes from preprocessor_config.json: patch_size, merge_size,
// temporal_patch_size, image_mean, image_std, resample (PIL numbering: 2
// bilinear, 3 bicubic) and the pixel bounds: top-level "min_pixels" /
// "max_pixels" win, else "size": {"shortest_edge", "longest_edge"} (Qwen3-VL
// writes the bounds there, as areas in pixels); absent fields keep
// PreprocessConfig's Qwen2-VL defaults.
//
// The model id (what goes into content keys; docs/KEYS_AND_PREPROCESSING.md):
//   "<model_type>:" + the first 32 hex digits of SHA-256 over, for each
//   vision tensor in ascending name order (prefix removed): its name, dtype,
//   shape and every byte; followed by the vision configuration the tower
//   uses (VisionConfig::Canonical()).
// All bytes are hashed, not only the headers, so a fine-tuned tower whose
// shapes are unchanged still gets its own id, while two copies of one
// checkpoint in different directories (or saved with the other prefix, or
// sharded differently) share it. Cost: one SHA-256 pass over the vision
// tensors at open. Measured with a random BF16 tower of Qwen2.5-VL-7B's
// shapes (676.5 M parameters, 1.35 GB; make_tiny_checkpoint.py --size 7b),
// `epd-encode inspect-model` took 1.6-2.4 s of CPU (8.5-11.5 s wall on the
// shared 2-vCPU development machine, page cache cold or warm).
//
// Errors (OpenCheckpoint):
//   kNotFound         the directory, config.json or preprocessor_config.json,
//                     or every weight file, is missing
//   kInvalidArgument  malformed JSON or a field of the wrong type (named); an
//                     unknown model_type/architecture (named, with the
//                     supported list); the index names a shard that does not
//                     exist, or a tensor its shard does not hold; a tensor in
//                     two shards; a vision tensor missing, unexpected, of the
//                     wrong shape, or not F32/F16/BF16 (each named); vision
//                     tensors under both prefixes; preprocessor and vision
//                     configs disagreeing on patch, merge or temporal size;
//                     every SafetensorsFile::Open error (truncated shard,
//                     header claiming bytes past the end of the file, ...)
//   kUnavailable      a file cannot be read or mapped
//
// Complexity: OpenCheckpoint parses the JSON files and the safetensors
// headers and hashes the vision tensors' bytes once: O(vision bytes); the
// language model's bytes cost nothing. Tensor() is O(log n).
//
// Ownership: a Checkpoint owns its mappings; TensorViews stay valid while it
// lives (hold the shared_ptr).
// Thread safety: immutable after OpenCheckpoint; safe to share.
//
// Example:
//   auto ckpt = epd::OpenCheckpoint("/models/Qwen2.5-VL-7B-Instruct");
//   if (!ckpt.ok()) return ckpt.status();
//   (*ckpt)->model_id();                 // "qwen2_5_vl:3f9a..."
//   (*ckpt)->preprocess().factor();      // 28
//   (*ckpt)->Tensor("merger.mlp.2.weight")->shape;  // {3584, 5120}
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "epd/core/status.h"
#include "epd/media/preprocess.h"
#include "epd/model/safetensors_file.h"

namespace epd {

enum class VisionArch : std::uint8_t {
  kQwen2VL,   // model_type "qwen2_vl"
  kQwen25VL,  // model_type "qwen2_5_vl"
  kQwen3VL,   // model_type "qwen3_vl"
};

// "qwen2_vl", "qwen2_5_vl", "qwen3_vl" (the model_type).
std::string_view VisionArchName(VisionArch arch);
// "qwen2_vl, qwen2_5_vl, qwen3_vl".
std::string SupportedVisionArchs();

// The vision tower's shape, from config.json "vision_config" (field names
// differ per architecture; here they are unified).
struct VisionConfig {
  VisionArch arch = VisionArch::kQwen2VL;
  std::int64_t depth = 0;       // blocks
  std::int64_t width = 0;       // embed_dim (Qwen2-VL) / hidden_size: the ViT width
  std::int64_t num_heads = 0;   // width % num_heads == 0, head_dim % 4 == 0
  std::int64_t mlp_hidden = 0;  // int(embed_dim * mlp_ratio) / intermediate_size
  std::int64_t out_hidden = 0;  // hidden_size (Qwen2-VL) / out_hidden_size: the LLM width
  std::int64_t in_channels = 3;
  std::int64_t patch_size = 14;
  std::int64_t temporal_patch_size = 2;
  std::int64_t merge_size = 2;  // spatial_merge_size
  std::string hidden_act;       // "quick_gelu", "silu", "gelu_pytorch_tanh" or "gelu"
  // Qwen2.5-VL: window attention everywhere except these blocks.
  std::int64_t window_size = 0;  // pixels; 112 = 8x8 patches of 14 before merge
  std::vector<std::int64_t> fullatt_block_indexes;
  // Qwen3-VL: learned position table (a square side^2 = num_position_embeddings)
  // and the blocks after which a deepstack merger taps the hidden state.
  std::int64_t num_position_embeddings = 0;
  std::vector<std::int64_t> deepstack_visual_indexes;

  std::int64_t head_dim() const { return width / num_heads; }
  std::int64_t patch_dim() const { return in_channels * temporal_patch_size * patch_size * patch_size; }
  std::int64_t deepstack_layers() const { return static_cast<std::int64_t>(deepstack_visual_indexes.size()); }
  // A fixed text rendering of every field, hashed into the model id.
  std::string Canonical() const;
};

// One expected vision tensor: name without prefix, and shape.
struct TensorSpec {
  std::string name;
  std::vector<std::int64_t> shape;
};

// The vision tensors `cfg` implies, in a fixed order (ascending by name is not
// guaranteed). Used by OpenCheckpoint to validate, and by towers to look up.
std::vector<TensorSpec> ExpectedVisionTensors(const VisionConfig& cfg);

class Checkpoint {
 public:
  const std::string& dir() const { return dir_; }
  const VisionConfig& vision() const { return vision_; }
  const PreprocessConfig& preprocess() const { return preprocess_; }
  // See the header comment.
  const std::string& model_id() const { return model_id_; }
  // "visual." or "model.visual.": where the tensors were found.
  const std::string& prefix() const { return prefix_; }
  // Weight files mapped (file names), in order.
  const std::vector<std::string>& weight_files() const { return weight_files_; }
  // The vision tensor `name` (prefix removed), or null.
  const TensorView* Tensor(std::string_view name) const;
  // Every vision tensor, by name (prefix removed).
  const std::map<std::string, TensorView, std::less<>>& tensors() const { return tensors_; }
  // Sum of numel over the vision tensors.
  std::int64_t parameter_count() const;

 private:
  friend StatusOr<std::shared_ptr<const Checkpoint>> OpenCheckpoint(const std::string& dir);
  Checkpoint() = default;

  std::string dir_;
  VisionConfig vision_;
  PreprocessConfig preprocess_;
  std::string model_id_;
  std::string prefix_;
  std::vector<std::string> weight_files_;
  std::vector<std::shared_ptr<const SafetensorsFile>> files_;  // keep the mappings alive
  std::map<std::string, TensorView, std::less<>> tensors_;
};

// Opens `dir`; see the header comment for what is read and the errors.
StatusOr<std::shared_ptr<const Checkpoint>> OpenCheckpoint(const std::string& dir);

// A one-paragraph description for `epd-encode inspect-model`: architecture,
// parameters, widths, deepstack, preprocessing and model id, one per line.
std::string DescribeCheckpoint(const Checkpoint& checkpoint);

}  // namespace epd
