// `epd-encode serve`: runs an EncodeServer until SIGTERM or SIGINT, then
// shuts down gracefully (--grace-s) and exits 0 (docs/SERVER.md). Prints one
// line "READY port=<p> metrics_port=<m> server_id=<id> http_port=<h>" on
// stdout once it accepts calls, so scripts can wait for it (http_port -1
// without --http-port: the OpenAI-compatible front, docs/VLLM.md,
// tools/http_front_flags.h).
//
// Exit codes: 0 success; 1 setup failed, or a usage error (main.cc maps
// every CLI11 parse error to 1).
#include <fmt/format.h>
#include <signal.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>

#include "cli_util.h"
#include "commands.h"
#include "epd/openai/openai_front.h"
#include "epd/server/front_door.h"
#include "epd/server/server.h"
#include "exit_deadline.h"
#include "flag_checks.h"
#include "http_front_flags.h"
#include "security_flags.h"
#include "server_commands.h"
#include "tenant_flags.h"
#include "worker_flags.h"

namespace epd::cli {
namespace {

struct ServeFlags {
  WorkerFlags worker;
  std::string host = "0.0.0.0";
  int port = 50051;
  int metrics_port = -1;
  std::string metrics_host;  // "" = --host
  std::string server_id;
  std::int64_t max_queue = 1024;
  double grace_s = 10;
  double keepalive_s = 60;
  double keepalive_timeout_s = 20;
  std::int64_t max_items_per_request = 256;
  double max_request_mb = 64;
  double max_buffered_mb = 256;
  double max_buffered_mb_per_tenant = 0;  // 0 = a quarter of max_buffered_mb
  double max_reply_mb = 1024;
  double max_reply_mb_per_connection = 256;
  double write_timeout_s = 30;
  int max_concurrent_streams = ServerOptions{}.max_concurrent_streams;
  int max_rpc_threads = 256;
  std::vector<std::string> listen;
  double shm_arena_mb = 0;
  std::int64_t shm_lease_ms = 5000;
  double ipc_export_mb = 0;       // CUDA IPC delivery's export bound; 0 = off
  std::int64_t ipc_lease_ms = 0;  // 0 = --shm-lease-ms
  std::int64_t shm_max_sessions = ServerOptions{}.shm_max_sessions;
  double max_inflight_request_mb = 1024;
  std::string tenant_header = ServerOptions{}.tenant_metadata;
  ServerSecurityFlags security;
  TenantFlags tenants;
  HttpFrontFlags http;
  ServeFlags() { worker.order = "fair"; }  // a server has many clients
};

std::int64_t MiB(double mb) { return static_cast<std::int64_t>(mb * (1 << 20)); }
std::chrono::milliseconds Millis(double seconds) {
  return std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000));
}

// The stop signals, blocked in every thread (the ones started later inherit
// the mask), for WaitForStopSignal to take with sigwait on this one.
sigset_t BlockStopSignals() {
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  return stop;
}

// Where the server listens and what bounds its memory, from the flags.
void ApplyServeLimits(const ServeFlags& f, ServerOptions& so) {
  so.address = f.host + ":" + std::to_string(f.port);
  so.server_id = f.server_id;
  so.metrics_port = f.metrics_port;
  so.metrics_address = f.metrics_host;
  so.max_items_per_request = f.max_items_per_request;
  so.max_request_bytes = MiB(f.max_request_mb);
  so.max_buffered_bytes = MiB(f.max_buffered_mb);
  so.max_buffered_bytes_per_tenant = MiB(f.max_buffered_mb_per_tenant);
  so.max_reply_bytes = MiB(f.max_reply_mb);
  so.max_reply_bytes_per_connection = MiB(f.max_reply_mb_per_connection);
  so.write_timeout = Millis(f.write_timeout_s);
  so.max_concurrent_streams = f.max_concurrent_streams;
  so.max_rpc_threads = f.max_rpc_threads;
  so.keepalive = Millis(f.keepalive_s);
  so.keepalive_timeout = Millis(f.keepalive_timeout_s);
  so.extra_addresses = f.listen;
  so.max_inflight_request_bytes = MiB(f.max_inflight_request_mb);
}

// Shared-memory and CUDA IPC delivery. CUDA IPC exports device-resident
// rows, which only the GPU tier has (`device` null without it).
void ApplyServeDelivery(const ServeFlags& f, Device* device, ServerOptions& so) {
  so.shm_arena_bytes = MiB(f.shm_arena_mb);
  so.shm_lease = std::chrono::milliseconds(f.shm_lease_ms);
  if (f.ipc_export_mb > 0) {
    if (device == nullptr) {
      FailCommand(1,
                  "--ipc-export-mb needs the GPU tier (--device cuda in a build with EPD_WITH_CUDA); "
                  "this server keeps its rows in host memory");
    }
    so.ipc_device = device;
    so.ipc_export_bytes = MiB(f.ipc_export_mb);
    so.ipc_lease = std::chrono::milliseconds(f.ipc_lease_ms);
  }
  so.shm_max_sessions = f.shm_max_sessions;
}

// Every ServerOptions field the flags set; fails the command on a bad
// security or tenant file.
ServerOptions MakeServeOptions(const ServeFlags& f, Device* device) {
  ServerOptions so;
  ApplyServeLimits(f, so);
  ApplyServeDelivery(f, device, so);
  so.on_requests_drained = ReleaseFreeMemory;
  so.tenant_metadata = f.tenant_header;
  if (Status s = ApplyServerSecurityFlags(f.security, so); !s.ok()) FailCommand(1, s.message());
  if (Status s = ApplyTenantFlags(f.tenants, so); !s.ok()) FailCommand(1, s.message());
  so.log = [](const std::string& line) { spdlog::warn("{}", line); };
  return so;
}

// The OpenAI-compatible front over `server`'s front door, or null without
// --http-port. A front that cannot start stops the server and fails the command.
std::unique_ptr<OpenAiFront> StartHttpFront(const ServeFlags& f, const ServerOptions& so, EncodeServer& server) {
  if (f.http.port < 0) return nullptr;
  StatusOr<std::unique_ptr<OpenAiFront>> started =
      OpenAiFront::Start(MakeOpenAiFrontOptions(f.http, so), server.front_door());
  if (!started.ok()) {
    server.Shutdown(std::chrono::milliseconds(0));
    FailCommand(1, "cannot start the HTTP front: " + started.status().ToString());
  }
  std::unique_ptr<OpenAiFront> front = std::move(*started);
  spdlog::info("OpenAI-compatible front on {}://{}:{} serving model '{}'; EC files: {}",
               so.tls_cert_pem.empty() ? "http" : "https", f.http.host, front->port(), front->served_model_name(),
               f.http.ec_dir.empty() ? std::string("not published (no --ec-dir)") : f.http.ec_dir);
  return front;
}

// The "serving ..." log line, then READY on stdout for scripts.
void AnnounceReady(const ServeFlags& f, const ServerOptions& so, const std::string& tower, const EncodeServer& server,
                   const OpenAiFront* front) {
  std::string also;
  for (const std::string& a : f.listen) also += " and " + a;
  spdlog::info("serving {} on {}:{}{} as '{}' (shared memory: {}; CUDA IPC: {}; metrics: {})", tower, f.host,
               server.port(), also, server.server_id(),
               so.shm_arena_bytes > 0 ? fmt::format("{:.0f} MiB arena, {} ms leases", f.shm_arena_mb, f.shm_lease_ms)
                                      : std::string("off"),
               so.ipc_export_bytes > 0 ? fmt::format("{:.0f} MiB of exports", f.ipc_export_mb) : std::string("off"),
               server.metrics_port() < 0
                   ? std::string("off")
                   : fmt::format("http://{}:{}/metrics", so.metrics_address.empty() ? f.host : so.metrics_address,
                                 server.metrics_port()));
  std::printf("READY port=%d metrics_port=%d server_id=%s http_port=%d\n", server.port(), server.metrics_port(),
              server.server_id().c_str(), front != nullptr ? front->port() : -1);
  std::fflush(stdout);
}

// Waits for SIGTERM or SIGINT, then gives calls in flight --grace-s to
// finish (the process exits anyway one second after), and logs the totals.
void ServeUntilStopped(const ServeFlags& f, sigset_t stop, EncodeServer& server, OpenAiFront* front) {
  int sig = 0;
  sigwait(&stop, &sig);
  spdlog::info("{}: stopping; calls in flight get {:.1f} s to finish", sig == SIGTERM ? "SIGTERM" : "SIGINT",
               f.grace_s);
  {
    const std::chrono::milliseconds grace = Millis(f.grace_s);
    const ExitDeadline backstop(grace + std::chrono::seconds(1),
                                "shutdown outlived --grace-s + 1 s (a tower batch still running?); exiting now");
    server.Shutdown(grace);  // the front answers 503 from here; its calls in flight finish
    if (front != nullptr) front->Stop();
  }
  const ServerStats s = server.Stats();
  spdlog::info("stopped after {} requests ({} items: {} l1, {} l2, {} l3, {} miss, {} joined)", s.worker.requests,
               s.worker.items, s.worker.hits_l1, s.worker.hits_l2, s.worker.hits_l3, s.worker.misses, s.worker.joins);
}

int RunServe(const ServeFlags& f) {
  TuneMalloc(MallocUse::kTower);
  const sigset_t stop = BlockStopSignals();
  WorkerOptions wo;
  wo.max_pending_items = f.max_queue;
  StatusOr<WorkerParts> parts = MakeWorkerParts(f.worker, wo);
  if (!parts.ok()) FailCommand(1, "cannot set up the worker (model, caches, --l3): " + parts.status().ToString());
  const ServerOptions so = MakeServeOptions(f, parts->device);
  const std::string tower = parts->tower->Describe();
  StatusOr<std::unique_ptr<EncodeServer>> server =
      EncodeServer::Start(so, std::move(parts->options), std::move(parts->tower));
  if (!server.ok()) FailCommand(1, "cannot start the server: " + server.status().ToString());
  std::unique_ptr<OpenAiFront> front = StartHttpFront(f, so, **server);
  AnnounceReady(f, so, tower, **server, front.get());
  ServeUntilStopped(f, stop, **server, front.get());
  return 0;
}

// The flags in three groups, registered in this order (--help lists them so).
// Where the server listens, and how it starts and stops talking.
void AddServeEndpointFlags(CLI::App& cmd, ServeFlags& f) {
  cmd.add_option("--host", f.host, "address to listen on")->capture_default_str();
  cmd.add_option("--port", f.port, "gRPC port, 0 = any free port (printed)")
      ->capture_default_str()
      ->check(Integer(0, 65535));
  cmd.add_option("--metrics-port", f.metrics_port, "Prometheus /metrics port, -1 = off, 0 = any free port")
      ->capture_default_str()
      ->check(Integer(-1, 65535));
  cmd.add_option("--metrics-host", f.metrics_host, "address the metrics endpoint listens on [--host]");
  cmd.add_option("--server-id", f.server_id, "name reported in every item [<hostname>:<port>]");
  cmd.add_option("--max-queue", f.max_queue,
                 "most images queued for the tower; requests past it get RESOURCE_EXHAUSTED (0 = unbounded)")
      ->capture_default_str()
      ->check(Integer(0));
  cmd.add_option("--grace-s", f.grace_s, "on SIGTERM/SIGINT, seconds calls in flight get to finish")
      ->capture_default_str()
      ->check(Number(0, 86400, "s"));
  cmd.add_option("--keepalive-s", f.keepalive_s,
                 "seconds without activity on a connection with a call open before the server pings the "
                 "client; 0 = gRPC's default (2 hours)")
      ->capture_default_str()
      ->check(ZeroOrNumber(0.001, 86400, "s"));
  cmd.add_option("--keepalive-timeout-s", f.keepalive_timeout_s,
                 "seconds a ping may go unanswered before the server drops the connection, its calls and "
                 "lease sessions; 0 = gRPC's default (20 s)")
      ->capture_default_str()
      ->check(ZeroOrNumber(0.001, 86400, "s"));
}

// What one request, the buffered results and the replies may hold.
void AddServeLimitFlags(CLI::App& cmd, ServeFlags& f) {
  cmd.add_option("--max-items-per-request", f.max_items_per_request, "most images in one request")
      ->capture_default_str()
      ->check(Integer(1));
  cmd.add_option("--max-request-mb", f.max_request_mb, "largest request message, MB")
      ->capture_default_str()
      ->check(Number(0.001, 2047, "MB"));
  cmd.add_option("--max-buffered-mb", f.max_buffered_mb,
                 "result bytes waiting for slow clients above which no new tower batch starts, MB")
      ->capture_default_str()
      ->check(Number(0.001, 1e9, "MB"));
  cmd.add_option("--max-buffered-mb-per-tenant", f.max_buffered_mb_per_tenant,
                 "one tenant's share of --max-buffered-mb: what it buffers past this never stops the tower; "
                 "0 = a quarter of --max-buffered-mb")
      ->capture_default_str()
      ->check(ZeroOrNumber(0.001, 1e9, "MB"));
  cmd.add_option("--max-reply-mb", f.max_reply_mb,
                 "memory held for replies handed to gRPC and not yet sent, all clients, MB; a reply past it "
                 "ends its call with RESOURCE_EXHAUSTED")
      ->capture_default_str()
      ->check(Number(0.001, 1e9, "MB"));
  cmd.add_option("--max-reply-mb-per-connection", f.max_reply_mb_per_connection, "the same per client connection, MB")
      ->capture_default_str()
      ->check(Number(0.001, 1e9, "MB"));
  cmd.add_option("--write-timeout-s", f.write_timeout_s,
                 "cancel an Encode call whose client accepts no reply bytes for this long, s; 0 = never")
      ->capture_default_str()
      ->check(ZeroOrNumber(0.001, 86400, "s"));
  cmd.add_option("--max-concurrent-streams", f.max_concurrent_streams,
                 "calls one client connection may have open at once (HTTP/2 max_concurrent_streams); "
                 "0 = no limit")
      ->capture_default_str()
      ->check(Integer(0, 1 << 30));
  cmd.add_option("--max-rpc-threads", f.max_rpc_threads,
                 "most handler threads of the sync methods (Health, Stats, Release); Encode calls hold none")
      ->capture_default_str()
      ->check(Integer(2, 100000));
}

// Further listeners, shared-memory and CUDA IPC delivery, admission and tenants.
void AddServeDeliveryFlags(CLI::App& cmd, ServeFlags& f) {
  cmd.add_option("--listen", f.listen,
                 "also listen here: unix:/path (a Unix domain socket, for clients on this host) or host:port; "
                 "repeatable");
  cmd.add_option("--shm-arena-mb", f.shm_arena_mb,
                 "shared-memory arena for clients on this host that ask for it (docs/SHM.md), MiB; 0 = off")
      ->capture_default_str()
      ->check(Number(0, 1 << 20, "MiB"));
  cmd.add_option("--shm-lease-ms", f.shm_lease_ms,
                 "how long a shared-memory reference stays valid without a release, ms")
      ->capture_default_str()
      ->check(Integer(10, 3600000));
  cmd.add_option("--ipc-export-mb", f.ipc_export_mb,
                 "CUDA IPC delivery of device-resident rows to clients on this GPU node that ask for it "
                 "(docs/SHM.md), MiB of live exports at most; 0 = off; needs --device cuda with the GPU tier")
      ->capture_default_str()
      ->check(Number(0, 1 << 20, "MiB"));
  cmd.add_option("--ipc-lease-ms", f.ipc_lease_ms,
                 "how long a CUDA IPC reference stays valid without a release, ms; 0 = --shm-lease-ms")
      ->capture_default_str()
      ->check(Integer(0, 3600000));
  cmd.add_option("--shm-max-sessions", f.shm_max_sessions,
                 "most lease sessions open at once (one per shared-memory client; its leases are released "
                 "when it disconnects); one more is refused")
      ->capture_default_str()
      ->check(Integer(1, 1 << 20));
  cmd.add_option("--max-inflight-request-mb", f.max_inflight_request_mb,
                 "request bytes admitted and not yet finished, MB; a request past it waits briefly, then gets "
                 "RESOURCE_EXHAUSTED (>= --max-request-mb)")
      ->capture_default_str()
      ->check(Number(0.001, 1e9, "MB"));
  cmd.add_option("--tenant-header", f.tenant_header,
                 "metadata key naming a client's fair share under --order fair; empty = by client address only")
      ->capture_default_str();
}

}  // namespace

void RegisterServeCommand(CLI::App& app) {
  auto f = std::make_shared<ServeFlags>();
  CLI::App* cmd = app.add_subcommand("serve", "run the gRPC encode server until SIGTERM/SIGINT");
  AddWorkerFlags(*cmd, f->worker);
  AddServeEndpointFlags(*cmd, *f);
  AddServeLimitFlags(*cmd, *f);
  AddServeDeliveryFlags(*cmd, *f);
  AddServerSecurityFlags(*cmd, f->security);
  AddTenantFlags(*cmd, f->tenants);
  AddHttpFrontFlags(*cmd, f->http);
  cmd->callback([f] {
    if (int rc = RunServe(*f); rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace epd::cli
