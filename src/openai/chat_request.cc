// See chat_request.h. Parsed with simdjson (Debian's libsimdjson): a request
// is mostly one or more data: URLs of hundreds of kilobytes, which a
// character-at-a-time parser spends most of a cache hit's time on.
#include "chat_request.h"

#include <simdjson.h>

#include <set>

namespace epd::internal {
namespace {

using simdjson::dom::element;

FrontError Bad(std::string message, std::string code, std::string param) {
  return FrontError{400, std::move(message), std::move(code), std::move(param)};
}

// Media part types an encoder instance does not encode.
const std::set<std::string, std::less<>>& Unsupported() {
  static const std::set<std::string, std::less<>> kTypes = {
      "audio_url", "input_audio", "image_embeds", "video_embeds", "audio_embeds",
      "image_pil", "file",        "input_image",  "input_file",   "prompt_embeds"};
  return kTypes;
}

// obj[key] when present (and not null).
std::optional<element> Field(const element& obj, std::string_view key) {
  element v;
  if (obj.is_object() && obj[key].get(v) == simdjson::SUCCESS && !v.is_null()) return v;
  return std::nullopt;
}

std::optional<std::string_view> String(const std::optional<element>& e) {
  std::string_view s;
  if (e.has_value() && e->get(s) == simdjson::SUCCESS) return s;
  return std::nullopt;
}

// The URL of a media part: part[type] as {"url": U} or as U itself.
std::optional<std::string_view> UrlOf(const element& part, std::string_view type) {
  const std::optional<element> m = Field(part, type);
  if (!m.has_value()) return std::nullopt;
  if (auto s = String(m)) return s;
  return String(Field(*m, "url"));
}

// Appends one media part as an item, or says why it cannot be one.
std::optional<FrontError> AddPart(const element& part, const std::string& where, ChatRequest& out) {
  const std::optional<std::string_view> type = String(Field(part, "type"));
  if (!part.is_object() || !type.has_value()) {
    return Bad(where + " must be an object with a string \"type\"", "invalid_request", where + ".type");
  }
  const std::string t(*type);
  if (t == "text" || t == "input_text") return std::nullopt;
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
  const std::optional<std::string_view> url = UrlOf(part, t);
  if (!url.has_value()) return Bad(where + " has no string " + t + ".url", "invalid_request", where + "." + t + ".url");
  item.url = std::string(*url);
  if (const std::optional<element> uuid = Field(part, "uuid")) {
    const std::optional<std::string_view> s = String(uuid);
    if (!s.has_value()) return Bad(where + ".uuid must be a string", "invalid_request", where + ".uuid");
    item.uuid = std::string(*s);
  }
  if (const std::optional<element> mark = Field(part, "epd_public")) {
    if (mark->get(item.is_public) != simdjson::SUCCESS) {
      return Bad(where + ".epd_public must be a boolean", "invalid_request", where + ".epd_public");
    }
  }
  out.items.push_back(std::move(item));
  return std::nullopt;
}

// Appends the media items of one message's content; an error otherwise.
std::optional<FrontError> AddParts(const element& content, const std::string& at, ChatRequest& out) {
  if (content.is_string() || content.is_null()) return std::nullopt;
  if (!content.is_array()) return Bad(at + " must be a string or an array of content parts", "invalid_request", at);
  std::size_t i = 0;
  for (const element part : content.get_array()) {
    if (auto e = AddPart(part, at + "[" + std::to_string(i++) + "]", out)) return e;
  }
  return std::nullopt;
}

// The small kwargs objects go to the kwargs check as nlohmann::json.
std::optional<FrontError> TakeKwargs(const element& body, const char* name, nlohmann::json& out) {
  const std::optional<element> v = Field(body, name);
  if (!v.has_value()) return std::nullopt;
  if (!v->is_object()) return Bad(std::string(name) + " must be an object", "invalid_request", name);
  out = nlohmann::json::parse(simdjson::minify(*v));
  return std::nullopt;
}

}  // namespace

std::variant<ChatRequest, FrontError> ParseChatRequest(std::string_view text) {
  simdjson::dom::parser parser;
  element body;
  if (parser.parse(text.data(), text.size()).get(body) != simdjson::SUCCESS) {
    return Bad("the request body is not valid JSON", "invalid_json", "");
  }
  if (!body.is_object()) return Bad("the request body must be a JSON object", "invalid_json", "");
  ChatRequest out;
  if (const std::optional<element> model = Field(body, "model")) {
    const std::optional<std::string_view> s = String(model);
    if (!s.has_value()) return Bad("model must be a string", "invalid_request", "model");
    out.model = std::string(*s);
  }
  const std::optional<element> messages = Field(body, "messages");
  if (!messages.has_value() || !messages->is_array()) {
    return Bad("messages must be an array of messages", "invalid_request", "messages");
  }
  std::size_t m = 0;
  for (const element msg : messages->get_array()) {
    const std::string at = "messages[" + std::to_string(m++) + "]";
    if (!msg.is_object()) return Bad(at + " must be an object", "invalid_request", at);
    if (const std::optional<element> content = Field(msg, "content")) {
      if (auto e = AddParts(*content, at + ".content", out)) return *e;
    }
  }
  bool stream = false;
  if (const std::optional<element> s = Field(body, "stream");
      s.has_value() && s->get(stream) == simdjson::SUCCESS && stream) {
    return Bad("stream: true is not supported: an encoder instance answers once the items are published",
               "stream_unsupported", "stream");
  }
  if (auto e = TakeKwargs(body, "mm_processor_kwargs", out.mm_processor_kwargs)) return *e;
  if (auto e = TakeKwargs(body, "media_io_kwargs", out.media_io_kwargs)) return *e;
  if (const std::optional<element> ec = Field(body, "ec_transfer_params");
      ec.has_value() && Field(*ec, "consumer_zmq")) {
    return Bad(
        "ec_transfer_params.consumer_zmq names a push connector's consumer; this encoder publishes files for "
        "ECExampleConnector (--ec-dir) only",
        "unsupported_connector", "ec_transfer_params.consumer_zmq");
  }
  return out;
}

}  // namespace epd::internal
