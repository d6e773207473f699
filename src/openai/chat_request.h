// src/openai/chat_request.h (internal): the part of an OpenAI
// /v1/chat/completions request an encoder instance reads.
//
// What vLLM's disaggregated-encoder proxy sends an encoder (its
// fanout_encoder_primer, docs/VLLM.md): {"model", "messages": [{"role",
// "content": [parts]}], "stream": false} plus, when the client sent them,
// "mm_processor_kwargs", "media_io_kwargs", "priority", "session_id". Each
// part of type "image_url" or "video_url" is an item, in order across all
// messages: {"type": "image_url", "image_url": {"url": U} (or "image_url":
// U), "uuid": id}. Text parts ("text", "input_text") and every other field
// (sampling, max_tokens, priority, ...) are ignored.
//
// Our one extension of the part: "epd_public": true marks the item public
// (ChatItem::is_public; the gRPC EncodeItem.public, docs/SECURITY.md), so
// that it is keyed in the shared "public" namespace where the caller's
// tenant is one of --public-readers (ignored otherwise, as over gRPC).
// Absent, null or false: the caller's own namespace.
//
// Refused, with status 400 and the field named in FrontError::param: a body
// that is not a JSON object (code invalid_json), "model" not a string,
// "messages" missing or not an array of objects, a "content" neither a
// string nor an array, a part without a string "type", a media part without
// a string URL, a "uuid" neither a string nor null, an "epd_public" neither
// a boolean nor null, a part of another media
// type (audio, embeddings: code unsupported_content), "stream": true
// (code stream_unsupported: an encoder instance finishes once the items are
// published), kwargs that are not objects, and "ec_transfer_params" naming a
// "consumer_zmq" (a push connector's: code unsupported_connector).
//
// Parsed with simdjson (chat_request.cc says why).
//
// Thread safety: a pure function.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "front_error.h"

namespace epd::internal {

enum class MediaKind { kImage, kVideo };

struct ChatItem {
  std::int64_t index = 0;  // position among the request's media parts
  MediaKind kind = MediaKind::kImage;
  std::string url;
  std::optional<std::string> uuid;
  bool is_public = false;  // "epd_public": true
  std::string where;       // "messages[0].content[2]", for messages
};

struct ChatRequest {
  std::optional<std::string> model;
  std::vector<ChatItem> items;
  nlohmann::json mm_processor_kwargs;  // null when absent
  nlohmann::json media_io_kwargs;      // null when absent
};

std::variant<ChatRequest, FrontError> ParseChatRequest(std::string_view body);

}  // namespace epd::internal
