// See kwargs_check.h.
#include "kwargs_check.h"

#include <cmath>
#include <map>
#include <string>
#include <vector>

namespace epd::internal {
namespace {

using nlohmann::json;

// A setting of this server a request may name: its value, or nullopt when
// the server has no such setting in force (e.g. num_frames when it samples
// by fps).
using Settings = std::map<std::string, std::optional<double>>;

Settings ProcessorSettings(const WorkerOptions& w) {
  return {{"min_pixels", static_cast<double>(w.preprocess.min_pixels)},
          {"max_pixels", static_cast<double>(w.preprocess.max_pixels)},
          {"size.shortest_edge", static_cast<double>(w.preprocess.min_pixels)},
          {"size.longest_edge", static_cast<double>(w.preprocess.max_pixels)},
          {"patch_size", w.preprocess.patch_size},
          {"merge_size", w.preprocess.merge_size},
          {"temporal_patch_size", w.preprocess.temporal_patch_size},
          {"fps", w.video_sampling.nframes ? std::nullopt : std::optional<double>(w.video_sampling.fps)}};
}

Settings MediaIoSettings(const WorkerOptions& w) {
  const VideoSampling& v = w.video_sampling;
  return {{"video.fps", v.nframes ? std::nullopt : std::optional<double>(v.fps)},
          {"video.num_frames", v.nframes ? std::optional<double>(static_cast<double>(*v.nframes)) : std::nullopt}};
}

// "a.b" -> value for every leaf of `j`.
void Flatten(const json& j, const std::string& prefix, std::vector<std::pair<std::string, const json*>>& out) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string key = prefix.empty() ? it.key() : prefix + "." + it.key();
    if (it->is_object()) {
      Flatten(*it, key, out);
    } else {
      out.emplace_back(key, &*it);
    }
  }
}

std::string Number(double v) {
  std::string s = std::to_string(v);
  s.erase(s.find_last_not_of('0') + 1);
  if (s.back() == '.') s.pop_back();
  return s;
}

// The keys of `kwargs` that differ from `mine` ("k = v (this server: w)"),
// and those it cannot match at all.
void Compare(const json& kwargs, const std::string& name, const Settings& mine, std::vector<std::string>& differ,
             std::vector<std::string>& unknown) {
  std::vector<std::pair<std::string, const json*>> leaves;
  Flatten(kwargs, "", leaves);
  for (const auto& [key, value] : leaves) {
    const auto it = mine.find(key);
    std::string entry = name;
    entry.append(".").append(key);
    if (it == mine.end() || !it->second.has_value()) {
      unknown.push_back(std::move(entry));
    } else if (!value->is_number() || std::abs(value->get<double>() - *it->second) > 1e-9 * std::abs(*it->second)) {
      entry.append(" = ").append(value->dump()).append(" (this server: ").append(Number(*it->second)).append(")");
      differ.push_back(std::move(entry));
    }
  }
}

std::string Join(const std::vector<std::string>& v) {
  std::string out;
  for (const std::string& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

}  // namespace

std::optional<FrontError> CheckProcessingKwargs(const json& mm_processor_kwargs, const json& media_io_kwargs,
                                                const WorkerOptions& server) {
  std::vector<std::string> differ, unknown;
  const bool processor = mm_processor_kwargs.is_object() && !mm_processor_kwargs.empty();
  if (processor) Compare(mm_processor_kwargs, "mm_processor_kwargs", ProcessorSettings(server), differ, unknown);
  if (media_io_kwargs.is_object())
    Compare(media_io_kwargs, "media_io_kwargs", MediaIoSettings(server), differ, unknown);
  std::string why;
  if (!differ.empty()) why += Join(differ) + " would change the embedding published under the item's id";
  if (!unknown.empty()) {
    why += std::string(why.empty() ? "" : "; ") + Join(unknown) + " cannot be matched by this server's configuration";
  }
  if (why.empty() && processor) {
    why =
        "mm_processor_kwargs equal this server's configuration, but vLLM keys an item by hash(uuid, "
        "mm_processor_kwargs) when they are non-empty, so the consumer would look for another file; send none";
  }
  if (why.empty()) return std::nullopt;
  std::string param = "mm_processor_kwargs";
  if (!differ.empty()) {
    param = differ[0].substr(0, differ[0].find(' '));
  } else if (!unknown.empty()) {
    param = unknown[0];
  }
  return FrontError{400, why, "processing_kwargs_refused", param};
}

}  // namespace epd::internal
