// src/model/checkpoint_config.h (internal to epd::model): a checkpoint's
// config.json and preprocessor_config.json read as the architecture, its
// VisionConfig and its PreprocessConfig (steps 1 and 2 of OpenCheckpoint,
// epd/model/checkpoint.h). Defaults for absent fields are transformers'
// Qwen2VLVisionConfig, Qwen2_5_VLVisionConfig and Qwen3VLVisionConfig and the
// Qwen2-VL image processor's.
//
// Errors name the file (`where`) and the field at fault. Thread safety: pure
// functions.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "epd/core/status.h"
#include "epd/media/preprocess.h"
#include "epd/model/checkpoint.h"

namespace epd::internal {

// The JSON document at `path`. Errors: kNotFound (no such regular file),
// kUnavailable (unreadable), kInvalidArgument (not JSON, with the parser's
// message).
StatusOr<nlohmann::json> ReadJson(const std::filesystem::path& path);

// The architecture config.json names: its model_type, else the first
// supported name in architectures. Errors: kInvalidArgument naming what was
// found and the supported model types.
StatusOr<VisionArch> DetectArch(const nlohmann::json& config, const std::string& where);

// config.json's vision_config for `arch`. Errors: kInvalidArgument for a
// missing vision_config, a field of the wrong type or out of range, or
// fields that disagree (hidden size not divisible by the heads, ...).
StatusOr<VisionConfig> ParseVisionConfig(VisionArch arch, const nlohmann::json& config, const std::string& where);

// preprocessor_config.json, cross-checked against the vision config (patch,
// merge and temporal patch sizes, 3 channels). Errors: kInvalidArgument.
StatusOr<PreprocessConfig> ParsePreprocess(const nlohmann::json& pre, const VisionConfig& v, const std::string& where);

}  // namespace epd::internal
