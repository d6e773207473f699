// epd/openai/openai_front.h: epd-encode as vLLM's encoder instance ("E" of
// vLLM's encoder-disaggregated flow, docs/VLLM.md): an OpenAI-compatible
// HTTP front beside the gRPC port, over the same server (its WorkerLoop,
// cache, joins, batching, L3, fair shares, request budget, bearer token and
// metrics, through epd/server/front_door.h).
//
// Routes (epd::HttpEndpoint, epd/http/http_endpoint.h: keep-alive, bounded
// threads, idle connections in an epoll park, body limit, header/body/idle
// timeouts, TLS when the server has a certificate):
//   POST /v1/chat/completions  what vLLM's disagg_epd_proxy.py sends an
//       encoder (src/openai/chat_request.h): each image_url / video_url part
//       is an item, in order, with its optional uuid. The media (data:,
//       http(s):// under the SSRF rules of epd/http/media_fetch.h, file://
//       under allowed_local_media_path) is encoded as a gRPC Encode call's
//       would be, each item is published as <ec_dir>/<id>/encoder_cache.
//       safetensors (epd/openai/ec_publisher.h; under tenant isolation in
//       the caller's <ec_dir>/tenant=<name>/) with id = the part's uuid
//       (any string; an unsafe one mapped, EcPublisher::IdName), else the
//       item's content key (hex), and the reply is a
//       chat.completion with "ec_transfer_params" (src/openai/chat_reply.h).
//       The content key still decides cache hits: two uuids naming the same
//       bytes share one tower run (and get a file each); one uuid naming two
//       different media in a request is refused (400).
//   POST /v1/probe             the same body and media rules as chat
//       completions; answers each item's content key, route key, grid and
//       tokens from its headers without decoding or encoding
//       (src/openai/probe_reply.h, docs/SERVER.md "Probe").
//   GET /health                200 while serving, 503 while draining; no token.
//   GET /v1/models             the served model name.
// Bearer token: when the server has one, the /v1 routes need
// "Authorization: Bearer <token>" (401 otherwise).
// Errors: OpenAI-style JSON, one status each (src/openai/front_error.h); a
// bad item fails its request only.
//
// Metrics (appended to the server's /metrics): epd_http_responses_total
// {status}, epd_http_media_fetches_total{outcome}, epd_ec_files_published_total,
// epd_ec_files_present_total, epd_ec_files_evicted_total,
// epd_ec_evicted_bytes_total, epd_ec_write_failures_total,
// epd_ec_over_budget_total, epd_ec_dir_files, epd_ec_dir_bytes,
// epd_http_parked_connections.
//
// Thread safety: thread-safe; requests are served on the endpoint's threads.
// Lifetime: Stop (or destroy) the front before the server it was given.
//
// Example:
//   epd::OpenAiFrontOptions o;
//   o.http.port = 8000;
//   o.ec_dir = "/dev/shm/ec";
//   auto front = epd::OpenAiFront::Start(o, server->front_door());
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "epd/core/status.h"
#include "epd/http/http_endpoint.h"
#include "epd/http/media_fetch.h"
#include "epd/openai/ec_publisher.h"
#include "epd/server/front_door.h"

namespace epd {

struct OpenAiFrontOptions {
  // host, port, TLS, threads, timeouts, body limit. `authorize` and
  // `error_page` are the front's own (the server's token, OpenAI JSON).
  HttpEndpointOptions http{};
  std::string served_model_name{};  // "" = the server's model id
  // Where items are published; "" = nowhere (the reply still carries the
  // metadata; for trying the front without a consumer).
  std::string ec_dir{};
  std::int64_t ec_dir_max_bytes = 0;  // 0 = unbounded
  std::chrono::milliseconds ec_dir_grace{30000};
  // The group of the published files (a name or a gid); "" = the server's.
  std::string ec_dir_group{};
  // http(s) fetches; max_bytes bounds data: and file:// media too, and
  // `timeout` is one request's deadline for all its media.
  MediaFetchOptions media{};
  int fetch_parallelism = 4;               // one request's media resolved at once
  int fetch_threads = 16;                  // all requests' fetches at once
  std::string allowed_local_media_path{};  // "" = file:// off
};

struct OpenAiFrontStats {
  std::map<int, std::uint64_t> responses;  // by HTTP status
  EcPublisherStats ec;
  HttpEndpointStats http;
};

class OpenAiFront {
 public:
  // kInvalidArgument for bad options (the endpoint's, an allowed local path
  // that is not a directory, bad allowed networks); EcPublisher::Open's
  // errors; kUnavailable when the port cannot be bound.
  static StatusOr<std::unique_ptr<OpenAiFront>> Start(OpenAiFrontOptions options, ServerFrontDoor door);
  ~OpenAiFront();
  OpenAiFront(const OpenAiFront&) = delete;
  OpenAiFront& operator=(const OpenAiFront&) = delete;

  int port() const;
  const std::string& served_model_name() const;
  OpenAiFrontStats Stats() const;
  void Stop();  // idempotent; requests being served finish

  struct Impl;

 private:
  explicit OpenAiFront(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace epd
