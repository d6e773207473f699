// src/openai/front_error.h (internal): an error the OpenAI front answers,
// and its page: {"error": {"message", "type", "param", "code"}}, the shape
// of OpenAI's API errors (and of vLLM's OpenAI server).
//
// Statuses (docs/VLLM.md, "Errors"): 400 malformed or refused input, 401
// unauthorised, 404 unknown model or path, 405, 408 slow request, 413 too
// large, 415 not JSON, 422 an undecodable image or video, 429 over the
// request budget or queue, 500 an internal failure (a tower failure, an EC
// file that cannot be written), 502 a media URL that could not be fetched,
// 503 draining. `type` is the status's OpenAI/vLLM error class name
// ("BadRequestError", ...); `code` a stable snake_case name of the cause
// ("invalid_json", "ec_dir_write_failed", ...); `param` the request field at
// fault ("messages[0].content[1].uuid") or null.
#pragma once

#include <string>

#include "epd/core/status.h"
#include "epd/http/http_endpoint.h"

namespace epd::internal {

struct FrontError {
  int status = 400;
  std::string message;
  std::string code;
  std::string param{};  // "" = null
};

HttpResponse ErrorResponse(const FrontError& e);
// The page of an HttpEndpoint error (404, 405, 408, 413, 401, 400).
HttpResponse EndpointErrorPage(int status, const std::string& message);

// The HTTP status of a failure from the worker, the media source or the EC
// publisher (`media`: a failure of one item's media or embedding, so
// kInvalidArgument is an undecodable item, 422, rather than a bad request):
//   kInvalidArgument 400 (422 for media), kPermissionDenied 400,
//   kNotFound 400, kResourceExhausted 429 (413 for media: too large),
//   kUnavailable 503 (502 for media: a fetch failed), kFailedPrecondition
//   422, kUnauthenticated 401, anything else 500.
int HttpStatusOf(StatusCode code, bool media);

}  // namespace epd::internal
