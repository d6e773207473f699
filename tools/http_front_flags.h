// tools/http_front_flags.h: the flags of `epd-encode serve` for its
// OpenAI-compatible HTTP front and ECExampleConnector publication
// (epd/openai/openai_front.h, docs/VLLM.md), and their translation into
// OpenAiFrontOptions.
//
// --http-port -1 (the default) leaves the front off; every other flag here
// then has no effect. The front takes the server's TLS certificate and
// bearer token (ServerOptions), so it is TLS exactly when gRPC is.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "epd/openai/openai_front.h"
#include "epd/server/server.h"

namespace epd::cli {

struct HttpFrontFlags {
  int port = -1;
  std::string host = "127.0.0.1";
  std::string served_model_name;
  int threads = 8;
  int max_idle_connections = 1024;
  double keepalive_s = 5;
  double header_timeout_s = 10;
  double body_timeout_s = 30;
  double write_timeout_s = 30;
  double max_body_mb = 64;
  double min_body_rate_kb = 16;
  std::string ec_dir;
  double ec_dir_max_mb = 0;
  double ec_dir_grace_s = 30;
  std::string ec_dir_group;
  std::vector<std::string> allowed_media_domains;
  std::vector<std::string> allowed_media_networks;
  bool allow_private_media_addresses = false;
  double media_fetch_timeout_s = 10;
  double media_max_mb = 64;
  int media_max_redirects = 3;
  int media_fetch_parallelism = 4;
  std::string allowed_local_media_path;
};

void AddHttpFrontFlags(CLI::App& cmd, HttpFrontFlags& f);
// The front's options; TLS and (through the door) the token come from `so`.
OpenAiFrontOptions MakeOpenAiFrontOptions(const HttpFrontFlags& f, const ServerOptions& so);

}  // namespace epd::cli
