// See http_front_flags.h.
#include "http_front_flags.h"

#include <algorithm>

#include "flag_checks.h"

namespace epd::cli {
namespace {

std::chrono::milliseconds Ms(double seconds) {
  return std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000));
}

std::int64_t Mb(double mb) { return static_cast<std::int64_t>(mb * (1 << 20)); }

// The endpoint: address, threads, limits and deadlines.
void AddServerFlags(CLI::App& cmd, HttpFrontFlags& f, const char* g) {
  cmd.add_option("--http-port", f.port, "port of the OpenAI-compatible HTTP front; -1 = off, 0 = any free port")
      ->capture_default_str()
      ->check(Integer(-1, 65535))
      ->group(g);
  cmd.add_option("--http-host", f.host, "address the HTTP front listens on")->capture_default_str()->group(g);
  cmd.add_option("--served-model-name", f.served_model_name,
                 "the model name requests must name (or omit) [the model id]")
      ->group(g);
  cmd.add_option("--http-threads", f.threads, "HTTP handlers run at once (a connection waiting for bytes holds none)")
      ->capture_default_str()
      ->check(Integer(1, 4096))
      ->group(g);
  cmd.add_option("--http-max-idle-connections", f.max_idle_connections,
                 "connections waiting for a request; one more closes the one nearest its deadline")
      ->capture_default_str()
      ->check(Integer(1, 1 << 20))
      ->group(g);
  cmd.add_option("--http-keepalive-s", f.keepalive_s, "an idle keep-alive connection is closed after this, s")
      ->capture_default_str()
      ->check(Number(0.001, 86400, "s"))
      ->group(g);
  cmd.add_option("--http-header-timeout-s", f.header_timeout_s, "time for a complete request head, s (then 408)")
      ->capture_default_str()
      ->check(Number(0.001, 86400, "s"))
      ->group(g);
  cmd.add_option("--http-body-timeout-s", f.body_timeout_s, "time for the request body after its head, s (then 408)")
      ->capture_default_str()
      ->check(Number(0.001, 86400, "s"))
      ->group(g);
  cmd.add_option("--http-write-timeout-s", f.write_timeout_s, "a response write blocked this long ends it, s")
      ->capture_default_str()
      ->check(Number(0.001, 86400, "s"))
      ->group(g);
  cmd.add_option("--http-min-body-rate-kb", f.min_body_rate_kb,
                 "after its first second, a request body slower than this on average gets 408, KB/s")
      ->capture_default_str()
      ->check(Number(0.001, 1e9, "KB/s"))
      ->group(g);
  cmd.add_option("--http-max-body-mb", f.max_body_mb, "largest request body, MB, however framed (413 past it)")
      ->capture_default_str()
      ->check(Number(0.001, 2047, "MB"))
      ->group(g);
}

// Where items are published for vLLM's ECExampleConnector.
void AddEcDirFlags(CLI::App& cmd, HttpFrontFlags& f, const char* g) {
  cmd.add_option("--ec-dir", f.ec_dir,
                 "publish each item as DIR/<id>/encoder_cache.safetensors for vLLM's ECExampleConnector "
                 "(its shared_storage_path), e.g. /dev/shm/ec")
      ->group(g);
  cmd.add_option("--ec-dir-max-mb", f.ec_dir_max_mb,
                 "bound on the files in --ec-dir, MB, oldest deleted first; 0 = none")
      ->capture_default_str()
      ->check(Number(0, 1e9, "MB"))
      ->group(g);
  cmd.add_option("--ec-dir-grace-s", f.ec_dir_grace_s, "a file younger than this is never deleted by the bound, s")
      ->capture_default_str()
      ->check(Number(0, 86400, "s"))
      ->group(g);
  cmd.add_option("--ec-dir-group", f.ec_dir_group,
                 "group (name or gid) of the files in --ec-dir, which are 0640 in directories 0750: the prefill's "
                 "group [the server's]")
      ->group(g);
}

// Media URLs: the SSRF rules, the fetches' bounds, local files.
void AddMediaFlags(CLI::App& cmd, HttpFrontFlags& f, const char* g) {
  cmd.add_option("--allowed-media-domains", f.allowed_media_domains,
                 "http(s) media only from these hosts (exact names; repeatable or comma-separated) [any]")
      ->delimiter(',')
      ->group(g);
  cmd.add_flag("--allow-private-media-addresses", f.allow_private_media_addresses,
               "let media URLs resolve to loopback, private, link-local and other non-public addresses")
      ->group(g);
  cmd.add_option("--allowed-media-networks", f.allowed_media_networks,
                 "non-public address ranges media URLs may resolve to anyway, e.g. 10.1.0.0/16 (repeatable)")
      ->delimiter(',')
      ->group(g);
  cmd.add_option("--media-fetch-timeout-s", f.media_fetch_timeout_s,
                 "one request's media fetches, all of them, redirects included, s")
      ->capture_default_str()
      ->check(Number(0.001, 3600, "s"))
      ->group(g);
  cmd.add_option("--media-fetch-parallelism", f.media_fetch_parallelism,
                 "one request's media URLs fetched at once (off the threads that serve other clients)")
      ->capture_default_str()
      ->check(Integer(1, 64))
      ->group(g);
  cmd.add_option("--media-max-mb", f.media_max_mb, "largest media item (fetched, data: or file://), MB")
      ->capture_default_str()
      ->check(Number(0.001, 2047, "MB"))
      ->group(g);
  cmd.add_option("--media-max-redirects", f.media_max_redirects, "redirects a media fetch may follow")
      ->capture_default_str()
      ->check(Integer(0, 20))
      ->group(g);
  cmd.add_option("--allowed-local-media-path", f.allowed_local_media_path,
                 "serve file:// media URLs from under this directory only [file:// off]")
      ->check(CLI::ExistingDirectory)
      ->group(g);
}

}  // namespace

void AddHttpFrontFlags(CLI::App& cmd, HttpFrontFlags& f) {
  const char* g = "OpenAI-compatible HTTP front (vLLM encoder instance, docs/VLLM.md)";
  AddServerFlags(cmd, f, g);
  AddEcDirFlags(cmd, f, g);
  AddMediaFlags(cmd, f, g);
}

OpenAiFrontOptions MakeOpenAiFrontOptions(const HttpFrontFlags& f, const ServerOptions& so) {
  OpenAiFrontOptions o;
  o.http.host = f.host;
  o.http.port = f.port;
  o.http.tls_cert_pem = so.tls_cert_pem;
  o.http.tls_key_pem = so.tls_key_pem;
  o.http.tls_client_ca_pem = so.tls_client_ca_pem;
  o.http.threads = f.threads;
  o.http.max_idle_connections = f.max_idle_connections;
  o.http.idle_timeout = Ms(f.keepalive_s);
  o.http.header_timeout = Ms(f.header_timeout_s);
  o.http.body_timeout = Ms(f.body_timeout_s);
  o.http.write_timeout = Ms(f.write_timeout_s);
  o.http.max_body_bytes = Mb(f.max_body_mb);
  o.http.min_body_bytes_per_s = std::max<std::int64_t>(1, static_cast<std::int64_t>(f.min_body_rate_kb * 1024));
  o.fetch_parallelism = f.media_fetch_parallelism;
  o.served_model_name = f.served_model_name;
  o.ec_dir = f.ec_dir;
  o.ec_dir_max_bytes = Mb(f.ec_dir_max_mb);
  o.ec_dir_grace = Ms(f.ec_dir_grace_s);
  o.ec_dir_group = f.ec_dir_group;
  o.media.max_bytes = Mb(f.media_max_mb);
  o.media.timeout = Ms(f.media_fetch_timeout_s);
  o.media.max_redirects = f.media_max_redirects;
  o.media.allowed_domains = f.allowed_media_domains;
  o.media.allow_private_addresses = f.allow_private_media_addresses;
  o.media.allowed_networks = f.allowed_media_networks;
  o.allowed_local_media_path = f.allowed_local_media_path;
  return o;
}

}  // namespace epd::cli
