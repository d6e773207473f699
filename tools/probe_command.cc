// tools/probe_command.cc: `epd-encode probe`, the header probe of files
// through a running server (the Probe RPC; docs/SERVER.md, "Probe"). Prints
// one JSON object a line per file, in order: {"file", "key", "route_key",
// "grid_thw", "tokens"} or {"file", "error"}; exit status 1 when any file
// (or the call) failed.
#include <chrono>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_util.h"
#include "commands.h"
#include "epd/client/client.h"
#include "flag_checks.h"
#include "http_client.h"
#include "security_flags.h"

namespace epd::cli {
namespace {

struct ProbeFlags {
  std::string server;
  std::vector<std::string> files;
  bool video = false;
  double timeout_s = 30;
  ClientSecurityFlags security;
};

int RunProbe(const ProbeFlags& f) {
  ClientOptions o;
  o.target = f.server;
  o.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(f.timeout_s * 1000));
  if (Status s = ApplyClientSecurityFlags(f.security, o); !s.ok()) return CommandError("probe", s.message());
  StatusOr<std::unique_ptr<EncodeClient>> client = EncodeClient::Connect(o);
  if (!client.ok()) return CommandError("probe", client.status().message());
  std::vector<ClientItem> items;
  for (const std::string& path : f.files) {
    StatusOr<std::string> bytes = ReadFile(path);
    if (!bytes.ok()) return CommandError("probe", bytes.status().message());
    ClientItem& item = items.emplace_back();
    (f.video || LooksLikeVideo(*bytes) ? item.video : item.image) = std::move(*bytes);
  }
  const ProbeResult r = (*client)->Probe(items);
  for (std::size_t i = 0; i < r.items.size(); ++i) {
    const ClientProbeItem& p = r.items[i];
    nlohmann::json line = {{"file", f.files[i]}};
    if (!p.status.ok()) {
      line["error"] = p.status.ToString();
    } else {
      line["key"] = p.key.Hex();
      line["route_key"] = p.route_key.Hex();
      line["grid_thw"] = {p.grid.t, p.grid.h, p.grid.w};
      line["tokens"] = p.tokens;
    }
    std::cout << line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  }
  return r.status.ok() ? 0 : 1;
}

}  // namespace

void RegisterProbeCommand(CLI::App& app) {
  auto f = std::make_shared<ProbeFlags>();
  CLI::App* cmd = app.add_subcommand(
      "probe", "each file's content key, route key, grid and tokens from a running server, without decoding");
  cmd->add_option("--server", f->server, "HOST:PORT of a server or of the nginx front, or unix:/path")->required();
  cmd->add_option("files", f->files, "image files (JPEG, PNG, ...) and video files (MP4, WebM, AVI)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_flag("--video", f->video, "send every file as a video (default: by its magic bytes)");
  cmd->add_option("--timeout-s", f->timeout_s, "deadline of the call, seconds")
      ->capture_default_str()
      ->check(Number(0, 1e6, "s", /*lo_open=*/true));
  AddClientSecurityFlags(*cmd, f->security);
  cmd->callback([f] {
    if (int rc = RunProbe(*f); rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace epd::cli
