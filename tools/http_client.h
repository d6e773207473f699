// tools/http_client.h: `epd-encode client --http URL`, images and videos
// sent through the OpenAI-compatible front (POST /v1/chat/completions,
// docs/VLLM.md) the way vLLM's EPD proxy sends them: one request, one
// image_url (or video_url, for files recognised as videos or with --video)
// part per file, in order, each a data: URL, with its --uuid when given.
//
// Prints one line per item, from the reply's ec_transfer_params:
//   index=<i> id=<published id> kind=<image|video> grid=<t>x<h>x<w>
// then "prompt_tokens=<n>" (the items' post-merge tokens). A refusal prints
// "HTTP <status> <type> (<code>): <message>" on stderr and returns 1.
// HTTP client: cpp-httplib (https:// with --tls-ca, or the system store).
#pragma once

#include <string>
#include <vector>

namespace epd::cli {

struct HttpClientOptions {
  std::string base_url;  // http://host:port or https://host:port
  std::vector<std::string> files;
  std::vector<std::string> uuids;  // one per file, or none
  bool video = false;              // every file is a video
  double timeout_s = 30;
  std::string token;    // bearer token, "" = none
  std::string ca_file;  // PEM CA for https, "" = the system's
};

// The exit status: 0, or 1 after printing why.
int RunHttpClient(const HttpClientOptions& o);

// A video container by its magic bytes (MP4/MOV "ftyp" at 4, WebM/Matroska
// EBML, RIFF AVI): what the gRPC client sends as a video too.
bool LooksLikeVideo(const std::string& bytes);

}  // namespace epd::cli
