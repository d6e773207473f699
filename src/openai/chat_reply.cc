// See chat_reply.h and front_error.h.
#include "chat_reply.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "front_error.h"

namespace epd::internal {
namespace {

using nlohmann::json;

std::string TypeOf(int status) {
  switch (status) {
    case 400:
    case 414:
    case 431:
      return "BadRequestError";
    case 499:
      return "ClientClosedRequestError";
    case 504:
      return "GatewayTimeoutError";
    case 401:
      return "AuthenticationError";
    case 404:
      return "NotFoundError";
    case 405:
      return "MethodNotAllowedError";
    case 408:
      return "RequestTimeoutError";
    case 413:
      return "RequestTooLargeError";
    case 415:
      return "UnsupportedMediaTypeError";
    case 422:
      return "UnprocessableEntityError";
    case 429:
      return "RateLimitError";
    case 502:
      return "BadGatewayError";
    case 503:
      return "ServiceUnavailableError";
    default:
      return "InternalServerError";
  }
}

std::string CodeOf(int status) {
  switch (status) {
    case 401:
      return "invalid_api_key";
    case 404:
      return "not_found";
    case 405:
      return "method_not_allowed";
    case 408:
      return "request_timeout";
    case 413:
      return "request_too_large";
    case 414:
      return "uri_too_long";
    case 431:
      return "request_header_fields_too_large";
    case 499:
      return "client_closed_request";
    case 500:
      return "internal_error";
    case 503:
      return "unavailable";
    default:
      return "invalid_request";
  }
}

}  // namespace

HttpResponse ErrorResponse(const FrontError& e) {
  json err = {{"message", e.message}, {"type", TypeOf(e.status)}, {"code", e.code}};
  err["param"] = e.param.empty() ? json(nullptr) : json(e.param);
  return HttpResponse{e.status, "application/json",
                      json{{"error", err}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)};
}

HttpResponse EndpointErrorPage(int status, const std::string& message) {
  return ErrorResponse(FrontError{status, message, CodeOf(status)});
}

int HttpStatusOf(StatusCode code, bool media) {
  switch (code) {
    case StatusCode::kInvalidArgument:
      return media ? 422 : 400;
    case StatusCode::kPermissionDenied:
    case StatusCode::kNotFound:
      return 400;
    case StatusCode::kResourceExhausted:
      return media ? 413 : 429;
    case StatusCode::kUnavailable:
      return media ? 502 : 503;
    case StatusCode::kFailedPrecondition:
      return 422;
    case StatusCode::kUnauthenticated:
      return 401;
    default:
      return 500;
  }
}

std::vector<double> PatchTimestamps(const std::vector<double>& frame_times_s, std::int64_t grid_t,
                                    std::int64_t temporal_patch) {
  std::vector<double> out;
  if (frame_times_s.empty() || temporal_patch <= 0) return out;
  const auto n = static_cast<std::int64_t>(frame_times_s.size());
  for (std::int64_t t = 0; t < grid_t; ++t) {
    const std::int64_t first = std::min(t * temporal_patch, n - 1);
    const std::int64_t last = std::min(t * temporal_patch + temporal_patch - 1, n - 1);
    out.push_back((frame_times_s[first] + frame_times_s[last]) / 2);
  }
  return out;
}

HttpResponse ChatCompletion(const std::string& completion_id, const std::string& model, std::int64_t created_s,
                            const std::vector<PublishedItem>& items, std::int64_t prompt_tokens) {
  json params = json::object();
  for (const PublishedItem& it : items) {
    json grid = json::array({it.grid.t, it.grid.h, it.grid.w});
    json metadata = json::object();
    if (it.kind == MediaKind::kImage) {
      metadata["image_grid_thw"] = grid;
    } else {
      metadata["video_grid_thw"] = grid;
      if (!it.timestamps.empty()) metadata["timestamps"] = it.timestamps;
    }
    params[it.id] = {{"metadata", metadata}, {"item_indices", it.indices}};
  }
  const json body = {
      {"id", completion_id},
      {"object", "chat.completion"},
      {"created", created_s},
      {"model", model},
      {"choices", json::array({{{"index", 0},
                                {"message", {{"role", "assistant"}, {"content", ""}}},
                                {"logprobs", nullptr},
                                {"finish_reason", "stop"}}})},
      {"usage", {{"prompt_tokens", prompt_tokens}, {"completion_tokens", 0}, {"total_tokens", prompt_tokens}}},
      {"ec_transfer_params", params}};
  return HttpResponse{200, "application/json", body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)};
}

}  // namespace epd::internal
