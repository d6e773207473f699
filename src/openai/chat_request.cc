// See chat_request.h.
#include "chat_request.h"

#include <set>

namespace epd::internal {
namespace {

using nlohmann::json;

FrontError Bad(std::string message, std::string code, std::string param) {
  return FrontError{400, std::move(message), std::move(code), std::move(param)};
}

// Media part types an encoder instance does not encode.
const std::set<std::string>& Unsupported() {
  static const std::set<std::string> kTypes = {"audio_url",    "input_audio",  "image_embeds", "video_embeds",
                                               "audio_embeds", "image_pil",    "file",         "input_image",
                                               "input_file",   "prompt_embeds"};
  return kTypes;
}

// The URL of a media part: part[type] as {"url": U} or as U itself.
std::optional<std::string> UrlOf(const json& part, const std::string& type) {
  const auto it = part.find(type);
  if (it == part.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    const auto url = it->find("url");
    if (url != it->end() && url->is_string()) return url->get<std::string>();
  }
  return std::nullopt;
}

// Appends the media items of one message's content; an error otherwise.
std::optional<FrontError> AddParts(const json& content, const std::string& at, ChatRequest& out) {
  if (content.is_string() || content.is_null()) return std::nullopt;
  if (!content.is_array()) return Bad(at + " must be a string or an array of content parts", "invalid_request", at);
  for (std::size_t i = 0; i < content.size(); ++i) {
    const json& part = content[i];
    const std::string where = at + "[" + std::to_string(i) + "]";
    const auto type = part.is_object() ? part.find("type") : part.end();
    if (!part.is_object() || type == part.end() || !type->is_string()) {
      return Bad(where + " must be an object with a string \"type\"", "invalid_request", where + ".type");
    }
    const std::string t = type->get<std::string>();
    if (t == "text" || t == "input_text") continue;
    if (Unsupported().count(t) != 0) {
      return Bad(where + " is of type '" + t + "'; this encoder instance encodes image_url and video_url parts only",
                 "unsupported_content", where + ".type");
    }
    if (t != "image_url" && t != "video_url") {
      return Bad(where + " has the unknown type '" + t + "'", "invalid_request", where + ".type");
    }
    ChatItem item;
    item.index = static_cast<std::int64_t>(out.items.size());
    item.kind = t == "image_url" ? MediaKind::kImage : MediaKind::kVideo;
    item.where = where;
    const std::optional<std::string> url = UrlOf(part, t);
    if (!url.has_value()) {
      return Bad(where + " has no string " + t + ".url", "invalid_request", where + "." + t + ".url");
    }
    item.url = *url;
    if (const auto uuid = part.find("uuid"); uuid != part.end() && !uuid->is_null()) {
      if (!uuid->is_string()) return Bad(where + ".uuid must be a string", "invalid_request", where + ".uuid");
      item.uuid = uuid->get<std::string>();
    }
    out.items.push_back(std::move(item));
  }
  return std::nullopt;
}

std::optional<FrontError> TakeKwargs(const json& body, const char* name, json& out) {
  const auto it = body.find(name);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_object()) return Bad(std::string(name) + " must be an object", "invalid_request", name);
  out = *it;
  return std::nullopt;
}

}  // namespace

std::variant<ChatRequest, FrontError> ParseChatRequest(std::string_view text) {
  const json body = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return Bad("the request body is not valid JSON", "invalid_json", "");
  if (!body.is_object()) return Bad("the request body must be a JSON object", "invalid_json", "");
  ChatRequest out;
  if (const auto model = body.find("model"); model != body.end() && !model->is_null()) {
    if (!model->is_string()) return Bad("model must be a string", "invalid_request", "model");
    out.model = model->get<std::string>();
  }
  const auto messages = body.find("messages");
  if (messages == body.end() || !messages->is_array()) {
    return Bad("messages must be an array of messages", "invalid_request", "messages");
  }
  for (std::size_t m = 0; m < messages->size(); ++m) {
    const json& msg = (*messages)[m];
    const std::string at = "messages[" + std::to_string(m) + "]";
    if (!msg.is_object()) return Bad(at + " must be an object", "invalid_request", at);
    if (const auto content = msg.find("content"); content != msg.end()) {
      if (auto e = AddParts(*content, at + ".content", out)) return *e;
    }
  }
  if (const auto stream = body.find("stream"); stream != body.end() && stream->is_boolean() && stream->get<bool>()) {
    return Bad("stream: true is not supported: an encoder instance answers once the items are published",
               "stream_unsupported", "stream");
  }
  if (auto e = TakeKwargs(body, "mm_processor_kwargs", out.mm_processor_kwargs)) return *e;
  if (auto e = TakeKwargs(body, "media_io_kwargs", out.media_io_kwargs)) return *e;
  if (const auto ec = body.find("ec_transfer_params");
      ec != body.end() && ec->is_object() && ec->contains("consumer_zmq")) {
    return Bad(
        "ec_transfer_params.consumer_zmq names a push connector's consumer; this encoder publishes files for "
        "ECExampleConnector (--ec-dir) only",
        "unsupported_connector", "ec_transfer_params.consumer_zmq");
  }
  return out;
}

}  // namespace epd::internal
