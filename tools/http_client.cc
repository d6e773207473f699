// See http_client.h.
#include "http_client.h"

#include <httplib.h>
#include <openssl/evp.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli_util.h"

namespace epd::cli {
namespace {

using nlohmann::json;

std::string Base64(const std::string& bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3) + 1, '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<int>(bytes.size()));
  out.resize(static_cast<std::size_t>(n));
  return out;
}

// The request body; "" (after printing why) when a file cannot be read.
std::string Body(const HttpClientOptions& o) {
  json content = json::array();
  for (std::size_t i = 0; i < o.files.size(); ++i) {
    StatusOr<std::string> bytes = ReadFile(o.files[i]);
    if (!bytes.ok()) {
      std::fprintf(stderr, "%s\n", bytes.status().message().c_str());
      return "";
    }
    const bool video = o.video || LooksLikeVideo(*bytes);
    const std::string type = video ? "video_url" : "image_url";
    json part = {
        {"type", type},
        {type, {{"url", std::string(video ? "data:video/mp4" : "data:image/png") + ";base64," + Base64(*bytes)}}}};
    if (i < o.uuids.size()) part["uuid"] = o.uuids[i];
    content.push_back(std::move(part));
  }
  return json{{"messages", json::array({{{"role", "user"}, {"content", content}}})}, {"stream", false}}.dump();
}

int Print(const json& reply) {
  const json& params = reply.value("ec_transfer_params", json::object());
  std::map<std::int64_t, std::string> lines;
  for (auto it = params.begin(); it != params.end(); ++it) {
    const json& meta = it->value("metadata", json::object());
    const bool video = meta.contains("video_grid_thw");
    const json& g = meta.value(video ? "video_grid_thw" : "image_grid_thw", json::array({0, 0, 0}));
    for (const json& index : it->value("item_indices", json::array())) {
      lines[index.get<std::int64_t>()] = "id=" + it.key() + " kind=" + (video ? "video" : "image") +
                                         " grid=" + std::to_string(g[0].get<std::int64_t>()) + "x" +
                                         std::to_string(g[1].get<std::int64_t>()) + "x" +
                                         std::to_string(g[2].get<std::int64_t>());
    }
  }
  for (const auto& [index, line] : lines) std::printf("index=%lld %s\n", static_cast<long long>(index), line.c_str());
  std::printf("prompt_tokens=%lld\n", static_cast<long long>(reply["usage"].value("prompt_tokens", 0)));
  return 0;
}

}  // namespace

bool LooksLikeVideo(const std::string& b) {
  if (b.size() >= 8 && b.compare(4, 4, "ftyp") == 0) return true;
  if (b.size() >= 4 && b.compare(0, 4, "\x1a\x45\xdf\xa3") == 0) return true;
  return b.size() >= 12 && b.compare(0, 4, "RIFF") == 0 && b.compare(8, 4, "AVI ") == 0;
}

int RunHttpClient(const HttpClientOptions& o) {
  const std::string body = Body(o);
  if (body.empty()) return 1;
  httplib::Client cli(o.base_url);
  if (!cli.is_valid()) {
    std::fprintf(stderr, "--http %s is not an http:// or https:// base URL\n", o.base_url.c_str());
    return 1;
  }
  if (!o.ca_file.empty()) cli.set_ca_cert_path(o.ca_file.c_str());
  if (!o.token.empty()) cli.set_bearer_token_auth(o.token);
  const auto timeout = std::chrono::milliseconds(static_cast<std::int64_t>(o.timeout_s * 1000));
  cli.set_connection_timeout(timeout);
  cli.set_read_timeout(timeout);
  cli.set_write_timeout(timeout);
  httplib::Result r = cli.Post("/v1/chat/completions", body, "application/json");
  if (!r) {
    std::fprintf(stderr, "UNAVAILABLE: POST %s/v1/chat/completions: %s\n", o.base_url.c_str(),
                 httplib::to_string(r.error()).c_str());
    return 1;
  }
  const json reply = json::parse(r->body, nullptr, /*allow_exceptions=*/false);
  if (r->status != 200 || reply.is_discarded()) {
    const json err = reply.is_discarded() ? json::object() : reply.value("error", json::object());
    std::fprintf(stderr, "HTTP %d %s (%s): %s\n", r->status, err.value("type", std::string("?")).c_str(),
                 err.value("code", std::string("?")).c_str(), err.value("message", r->body).c_str());
    return 1;
  }
  return Print(reply);
}

}  // namespace epd::cli
