// `epd-encode serve | client`: the gRPC encode server and its command-line
// client (docs/SERVER.md). bench-server has its own file
// (bench_server_command.cc).
//
//   serve         runs an EncodeServer until SIGTERM or SIGINT, then shuts
//                 down gracefully (--grace-s) and exits 0. Prints one line
//                 "READY port=<p> metrics_port=<m> server_id=<id> http_port=<h>"
//                 on stdout once it accepts calls, so scripts can wait for it
//                 (http_port -1 without --http-port: the OpenAI-compatible
//                 front, docs/VLLM.md, tools/http_front_flags.h).
//   client        with --http URL: through the OpenAI-compatible front
//                 (tools/http_client.h); otherwise over gRPC:
//                 encodes image and video files (a video is recognised by
//                 its container's magic bytes, MP4/MOV, WebM/Matroska, AVI,
//                 or forced with --video); one stdout line per item:
//                   index=<i> key=<hex> tokens=<n> hidden=<h> source=<l1|l2|l3|miss|joined> ms=<server ms> server=<id>
//                   delivery=<inline|shm|cuda_ipc>
//                 an item that came by CUDA IPC (--cuda-ipc) adds
//                   device=<the server's exporting device> bytes=<main + deepstack> dtype=<d> deepstack_layers=<n>
//                 and for a video also grid=<t>x<h>x<w> frames=<n> seconds_per_grid_t=<s>
//                 --out FILE writes the embeddings as safetensors
//                 (epd/worker/safetensors.h; rows by CUDA IPC are copied to the host
//                 for it). Leases (--shm, --cuda-ipc) are released together
//                 in one Release call once every item is printed. A failure
//                 prints "<CODE_NAME>: <message>" on stderr and exits 1.
//                 --cuda-ipc needs a build with CUDA (EPD_WITH_CUDA) and a
//                 CUDA device; otherwise it fails before any call, naming why.
//
// Exit codes: 0 success; 1 a call or item failed (client), setup failed, or
// a usage error (main.cc maps every CLI11 parse error to 1).
#include <fmt/format.h>
#include <signal.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>

#include "cli_util.h"
#include "commands.h"
#include "epd/client/client.h"
#include "epd/gpu/device.h"
#include "epd/openai/openai_front.h"
#include "epd/server/front_door.h"
#include "epd/server/server.h"
#include "epd/worker/safetensors.h"
#include "exit_deadline.h"
#include "flag_checks.h"
#include "http_client.h"
#include "http_front_flags.h"
#include "security_flags.h"
#include "tenant_flags.h"
#include "worker_flags.h"
#ifdef EPD_CLIENT_WITH_CUDA
#include "epd/gpu_cuda/cuda_device.h"
#endif

namespace epd::cli {
namespace {

// ---------------------------------------------------------------- serve ---

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

int RunServe(const ServeFlags& f) {
  TuneMalloc(MallocUse::kTower);
  // Block the stop signals in every thread (the ones started below inherit
  // the mask) and take them with sigwait on this one.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  WorkerOptions wo;
  wo.max_pending_items = f.max_queue;
  StatusOr<WorkerParts> parts = MakeWorkerParts(f.worker, wo);
  if (!parts.ok()) FailCommand(1, "cannot set up the worker (model, caches, --l3): " + parts.status().ToString());

  ServerOptions so;
  so.address = f.host + ":" + std::to_string(f.port);
  so.server_id = f.server_id;
  so.metrics_port = f.metrics_port;
  so.metrics_address = f.metrics_host;
  so.max_items_per_request = f.max_items_per_request;
  so.max_request_bytes = static_cast<std::int64_t>(f.max_request_mb * (1 << 20));
  so.max_buffered_bytes = static_cast<std::int64_t>(f.max_buffered_mb * (1 << 20));
  so.max_buffered_bytes_per_tenant = static_cast<std::int64_t>(f.max_buffered_mb_per_tenant * (1 << 20));
  so.max_reply_bytes = static_cast<std::int64_t>(f.max_reply_mb * (1 << 20));
  so.max_reply_bytes_per_connection = static_cast<std::int64_t>(f.max_reply_mb_per_connection * (1 << 20));
  so.write_timeout = std::chrono::milliseconds(static_cast<std::int64_t>(f.write_timeout_s * 1000));
  so.max_concurrent_streams = f.max_concurrent_streams;
  so.max_rpc_threads = f.max_rpc_threads;
  so.keepalive = std::chrono::milliseconds(static_cast<std::int64_t>(f.keepalive_s * 1000));
  so.keepalive_timeout = std::chrono::milliseconds(static_cast<std::int64_t>(f.keepalive_timeout_s * 1000));
  so.extra_addresses = f.listen;
  so.shm_arena_bytes = static_cast<std::int64_t>(f.shm_arena_mb * (1 << 20));
  so.shm_lease = std::chrono::milliseconds(f.shm_lease_ms);
  if (f.ipc_export_mb > 0) {
    // CUDA IPC exports device-resident rows: only the GPU tier has them.
    if (parts->device == nullptr) {
      FailCommand(1,
                  "--ipc-export-mb needs the GPU tier (--device cuda in a build with EPD_WITH_CUDA); "
                  "this server keeps its rows in host memory");
    }
    so.ipc_device = parts->device;
    so.ipc_export_bytes = static_cast<std::int64_t>(f.ipc_export_mb * (1 << 20));
    so.ipc_lease = std::chrono::milliseconds(f.ipc_lease_ms);
  }
  so.shm_max_sessions = f.shm_max_sessions;
  so.max_inflight_request_bytes = static_cast<std::int64_t>(f.max_inflight_request_mb * (1 << 20));
  so.on_requests_drained = ReleaseFreeMemory;
  so.tenant_metadata = f.tenant_header;
  if (Status s = ApplyServerSecurityFlags(f.security, so); !s.ok()) FailCommand(1, s.message());
  if (Status s = ApplyTenantFlags(f.tenants, so); !s.ok()) FailCommand(1, s.message());
  so.log = [](const std::string& line) { spdlog::warn("{}", line); };
  const std::string tower = parts->tower->Describe();
  StatusOr<std::unique_ptr<EncodeServer>> server =
      EncodeServer::Start(so, std::move(parts->options), std::move(parts->tower));
  if (!server.ok()) FailCommand(1, "cannot start the server: " + server.status().ToString());

  std::unique_ptr<OpenAiFront> front;
  if (f.http.port >= 0) {
    StatusOr<std::unique_ptr<OpenAiFront>> started =
        OpenAiFront::Start(MakeOpenAiFrontOptions(f.http, so), (*server)->front_door());
    if (!started.ok()) {
      (*server)->Shutdown(std::chrono::milliseconds(0));
      FailCommand(1, "cannot start the HTTP front: " + started.status().ToString());
    }
    front = std::move(*started);
    spdlog::info("OpenAI-compatible front on {}://{}:{} serving model '{}'; EC files: {}",
                 so.tls_cert_pem.empty() ? "http" : "https", f.http.host, front->port(), front->served_model_name(),
                 f.http.ec_dir.empty() ? std::string("not published (no --ec-dir)") : f.http.ec_dir);
  }
  std::string also;
  for (const std::string& a : f.listen) also += " and " + a;
  spdlog::info("serving {} on {}:{}{} as '{}' (shared memory: {}; CUDA IPC: {}; metrics: {})", tower, f.host,
               (*server)->port(), also, (*server)->server_id(),
               so.shm_arena_bytes > 0 ? fmt::format("{:.0f} MiB arena, {} ms leases", f.shm_arena_mb, f.shm_lease_ms)
                                      : std::string("off"),
               so.ipc_export_bytes > 0 ? fmt::format("{:.0f} MiB of exports", f.ipc_export_mb) : std::string("off"),
               (*server)->metrics_port() < 0
                   ? std::string("off")
                   : fmt::format("http://{}:{}/metrics", so.metrics_address.empty() ? f.host : so.metrics_address,
                                 (*server)->metrics_port()));
  std::printf("READY port=%d metrics_port=%d server_id=%s http_port=%d\n", (*server)->port(), (*server)->metrics_port(),
              (*server)->server_id().c_str(), front != nullptr ? front->port() : -1);
  std::fflush(stdout);

  int sig = 0;
  sigwait(&stop, &sig);
  spdlog::info("{}: stopping; calls in flight get {:.1f} s to finish", sig == SIGTERM ? "SIGTERM" : "SIGINT",
               f.grace_s);
  {
    const std::chrono::milliseconds grace(static_cast<std::int64_t>(f.grace_s * 1000));
    const ExitDeadline backstop(grace + std::chrono::seconds(1),
                                "shutdown outlived --grace-s + 1 s (a tower batch still running?); exiting now");
    (*server)->Shutdown(grace);  // the front answers 503 from here; its calls in flight finish
    if (front != nullptr) front->Stop();
  }
  const ServerStats s = (*server)->Stats();
  spdlog::info("stopped after {} requests ({} items: {} l1, {} l2, {} l3, {} miss, {} joined)", s.worker.requests,
               s.worker.items, s.worker.hits_l1, s.worker.hits_l2, s.worker.hits_l3, s.worker.misses, s.worker.joins);
  return 0;
}

// --------------------------------------------------------------- client ---

struct ClientFlags {
  std::string server;
  std::string http;  // the OpenAI-compatible front's base URL instead of --server
  std::vector<std::string> uuids;
  std::vector<std::string> images;
  std::string out;
  double timeout_s = 30;
  bool no_route = false;
  bool shm = false;
  bool cuda_ipc = false;
  int cuda_device = 0;
  std::string request_id;
  bool video = false;
  double video_fps = 0;  // 0: the server's default
  ClientSecurityFlags security;
};

// The device --cuda-ipc imports the server's rows on: CUDA device
// `f.cuda_device`, opened before any call so that a build or machine without
// one fails at once, saying why.
StatusOr<std::unique_ptr<Device>> OpenIpcDevice(const ClientFlags& f) {
#ifdef EPD_CLIENT_WITH_CUDA
  CudaDeviceOptions o;
  o.device_index = f.cuda_device;
  StatusOr<std::unique_ptr<Device>> dev = OpenCudaDevice(o);
  if (!dev.ok()) {
    return Status(dev.status().code(), "--cuda-ipc: cannot open CUDA device " + std::to_string(f.cuda_device) +
                                           " to import the server's rows: " + dev.status().message());
  }
  return dev;
#else
  (void)f;
  return FailedPrecondition(
      "--cuda-ipc: this epd-encode was built without CUDA (EPD_WITH_CUDA=OFF), so it has no CUDA device to import "
      "the server's GPU memory into; use a build with -DEPD_WITH_CUDA=ON on the server's GPU node, or --shm "
      "(a server on this host) or no flag (inline rows)");
#endif
}

// An owned host copy of rows imported by CUDA IPC (for --out): waits for the
// server's copy, then one device-to-host copy per tensor on `device`.
StatusOr<EmbeddingPtr> CopyIpcToHost(Device& device, const IpcLease& lease) {
  if (Status s = lease.WaitReady(); !s.ok()) return s;
  auto e = std::make_shared<Embedding>();
  static_cast<EmbeddingShape&>(*e) = lease.shape();
  e->grid = lease.grid();
  e->main.resize(lease.main_bytes());
  e->deepstack.resize(lease.deepstack_bytes());
  if (!e->main.empty()) {
    if (Status s =
            device.CopyAsync(e->main.data(), lease.main(), e->main.size(), CopyKind::kDeviceToHost, Stream::kOffload);
        !s.ok()) {
      return s;
    }
  }
  if (!e->deepstack.empty()) {
    if (Status s = device.CopyAsync(e->deepstack.data(), lease.deepstack(), e->deepstack.size(),
                                    CopyKind::kDeviceToHost, Stream::kOffload);
        !s.ok()) {
      return s;
    }
  }
  if (Status s = device.Synchronize(Stream::kOffload); !s.ok()) return s;
  return EmbeddingPtr(std::move(e));
}

int RunClient(const ClientFlags& f) {
  TuneMalloc(MallocUse::kMessages);
  if (f.server.empty() == f.http.empty())
    FailCommand(1, "give exactly one of --server HOST:PORT (gRPC) and --http URL");
  if (!f.http.empty()) {
    HttpClientOptions h;
    h.base_url = f.http;
    h.files = f.images;
    h.uuids = f.uuids;
    h.video = f.video;
    h.timeout_s = f.timeout_s;
    h.ca_file = f.security.tls_ca;
    ClientOptions security;
    if (Status s = ApplyClientSecurityFlags(f.security, security); !s.ok()) FailCommand(1, s.message());
    h.token = security.auth_token;
    return RunHttpClient(h);
  }
  if (!f.uuids.empty()) FailCommand(1, "--uuid goes with --http");
  // Declared before the client and the results, so it outlives both and
  // every IpcLease they hold (ClientOptions::ipc_device).
  std::unique_ptr<Device> ipc_device;
  if (f.cuda_ipc) {
    StatusOr<std::unique_ptr<Device>> dev = OpenIpcDevice(f);
    if (!dev.ok()) FailCommand(1, dev.status().ToString());
    ipc_device = std::move(*dev);
  }
  std::vector<ClientItem> items;
  for (const std::string& path : f.images) {
    StatusOr<std::string> bytes = ReadFile(path);
    if (!bytes.ok()) FailCommand(1, bytes.status().message());
    ClientItem item;
    if (f.video || LooksLikeVideo(*bytes)) {
      item.video = std::move(*bytes);
      if (f.video_fps > 0) {
        item.sampling = VideoSampling{};
        item.sampling->fps = f.video_fps;
      }
    } else {
      item.image = std::move(*bytes);
    }
    items.push_back(std::move(item));
  }
  ClientOptions co;
  co.target = f.server;
  co.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(f.timeout_s * 1000));
  co.route_by_key = !f.no_route;
  co.delivery = f.shm ? Delivery::kShm : Delivery::kInline;
  if (f.cuda_ipc) {
    // With --shm too, items that cannot go by CUDA IPC come by shared memory.
    co.delivery = Delivery::kCudaIpc;
    co.ipc_device = ipc_device.get();
    co.ipc_fallback_shm = f.shm;
  }
  if (Status s = ApplyClientSecurityFlags(f.security, co); !s.ok()) FailCommand(1, s.message());
  StatusOr<std::unique_ptr<EncodeClient>> client = EncodeClient::Connect(co);
  if (!client.ok()) FailCommand(1, client.status().ToString());

  EncodeResult r = (*client)->Encode(std::move(items), f.request_id);
  std::vector<KeyedEmbedding> out;
  int rc = 0;
  for (const ClientItemResult& item : r.items) {
    if (item.status.ok() && item.ipc != nullptr) {
      // The rows are in this node's GPU memory; what came back is printed
      // once the server's copy into them has landed.
      if (Status s = item.ipc->WaitReady(); !s.ok()) {
        std::fprintf(stderr, "index=%lld %s: the CUDA IPC rows did not land: %s\n", static_cast<long long>(item.index),
                     GrpcStatusName(s.code()).c_str(), s.message().c_str());
        rc = 1;
        continue;
      }
      const EmbeddingShape& e = item.ipc->shape();
      std::printf(
          "index=%lld key=%s tokens=%lld hidden=%lld source=%s ms=%.3f server=%s delivery=cuda_ipc "
          "device=%s bytes=%zu dtype=%s deepstack_layers=%lld\n",
          static_cast<long long>(item.index), item.key.Hex().c_str(), static_cast<long long>(e.tokens),
          static_cast<long long>(e.hidden), std::string(ItemSourceName(item.source)).c_str(), item.total_ms,
          item.server_id.c_str(), item.ipc->server_device().c_str(), item.ipc->nbytes(),
          std::string(DTypeName(e.dtype)).c_str(), static_cast<long long>(e.deepstack_layers));
      if (item.video != nullptr) {
        const GridTHW& g = item.ipc->grid();
        std::printf("index=%lld grid=%lldx%lldx%lld frames=%zu seconds_per_grid_t=%.6g\n",
                    static_cast<long long>(item.index), static_cast<long long>(g.t), static_cast<long long>(g.h),
                    static_cast<long long>(g.w), item.video->timestamps_s.size(), item.video->seconds_per_grid_t);
      }
      if (!f.out.empty()) {
        StatusOr<EmbeddingPtr> host = CopyIpcToHost(*ipc_device, *item.ipc);
        if (!host.ok()) {
          std::fprintf(stderr, "index=%lld %s: copying the CUDA IPC rows to the host for --out: %s\n",
                       static_cast<long long>(item.index), GrpcStatusName(host.status().code()).c_str(),
                       host.status().message().c_str());
          rc = 1;
          continue;
        }
        out.push_back({item.key, std::move(*host)});
      }
      continue;
    }
    if (!item.status.ok()) {
      // One line per failed item when there are several; the final line
      // below always carries the (lowest-index) failure.
      if (r.items.size() > 1) {
        std::fprintf(stderr, "index=%lld %s: %s\n", static_cast<long long>(item.index),
                     GrpcStatusName(item.status.code()).c_str(), item.status.message().c_str());
      }
      continue;
    }
    // Rows sent by reference are copied out of the arena only for --out.
    const EmbeddingShape& e = item.shm != nullptr ? item.shm->shape() : item.embedding->shape();
    std::printf("index=%lld key=%s tokens=%lld hidden=%lld source=%s ms=%.3f server=%s delivery=%s\n",
                static_cast<long long>(item.index), item.key.Hex().c_str(), static_cast<long long>(e.tokens),
                static_cast<long long>(e.hidden), std::string(ItemSourceName(item.source)).c_str(), item.total_ms,
                item.server_id.c_str(), item.shm != nullptr ? "shm" : "inline");
    if (item.video != nullptr) {
      const GridTHW& g = item.shm != nullptr ? item.shm->grid() : item.embedding->grid;
      std::printf("index=%lld grid=%lldx%lldx%lld frames=%zu seconds_per_grid_t=%.6g\n",
                  static_cast<long long>(item.index), static_cast<long long>(g.t), static_cast<long long>(g.h),
                  static_cast<long long>(g.w), item.video->timestamps_s.size(), item.video->seconds_per_grid_t);
    }
    if (!f.out.empty()) out.push_back({item.key, item.shm != nullptr ? item.shm->Copy() : item.embedding});
  }
  std::fflush(stdout);
  // Every lease (--shm, --cuda-ipc) goes back now, in one Release call: the
  // rows were printed or copied above. A refusal (a lease that expired
  // meanwhile) costs nothing, so it is only reported.
  const bool leased = std::any_of(r.items.begin(), r.items.end(), [](const ClientItemResult& item) {
    return item.shm != nullptr || item.ipc != nullptr;
  });
  for (ClientItemResult& item : r.items) {
    item.shm.reset();
    item.ipc.reset();
  }
  if (leased) {
    if (Status s = (*client)->FlushReleases(); !s.ok()) spdlog::warn("releasing the leases: {}", s.ToString());
  }
  if (!f.out.empty() && !out.empty()) {
    std::map<std::string, std::string> meta = {{"server", f.server}};
    if (StatusOr<ServerInfo> info = (*client)->Health(); info.ok()) meta["model_id"] = info->model_id;
    if (Status s = WriteEmbeddingsSafetensors(f.out, out, meta); !s.ok()) FailCommand(1, "--out: " + s.ToString());
  }
  if (!r.status.ok()) {
    std::fprintf(stderr, "%s: %s\n", GrpcStatusName(r.status.code()).c_str(), r.status.message().c_str());
    return 1;
  }
  return rc;
}

}  // namespace

void RegisterServerCommands(CLI::App& app) {
  {
    auto f = std::make_shared<ServeFlags>();
    CLI::App* cmd = app.add_subcommand("serve", "run the gRPC encode server until SIGTERM/SIGINT");
    AddWorkerFlags(*cmd, f->worker);
    cmd->add_option("--host", f->host, "address to listen on")->capture_default_str();
    cmd->add_option("--port", f->port, "gRPC port, 0 = any free port (printed)")
        ->capture_default_str()
        ->check(Integer(0, 65535));
    cmd->add_option("--metrics-port", f->metrics_port, "Prometheus /metrics port, -1 = off, 0 = any free port")
        ->capture_default_str()
        ->check(Integer(-1, 65535));
    cmd->add_option("--metrics-host", f->metrics_host, "address the metrics endpoint listens on [--host]");
    cmd->add_option("--server-id", f->server_id, "name reported in every item [<hostname>:<port>]");
    cmd->add_option("--max-queue", f->max_queue,
                    "most images queued for the tower; requests past it get RESOURCE_EXHAUSTED (0 = unbounded)")
        ->capture_default_str()
        ->check(Integer(0));
    cmd->add_option("--grace-s", f->grace_s, "on SIGTERM/SIGINT, seconds calls in flight get to finish")
        ->capture_default_str()
        ->check(Number(0, 86400, "s"));
    cmd->add_option("--keepalive-s", f->keepalive_s,
                    "seconds without activity on a connection with a call open before the server pings the "
                    "client; 0 = gRPC's default (2 hours)")
        ->capture_default_str()
        ->check(ZeroOrNumber(0.001, 86400, "s"));
    cmd->add_option("--keepalive-timeout-s", f->keepalive_timeout_s,
                    "seconds a ping may go unanswered before the server drops the connection, its calls and "
                    "lease sessions; 0 = gRPC's default (20 s)")
        ->capture_default_str()
        ->check(ZeroOrNumber(0.001, 86400, "s"));
    cmd->add_option("--max-items-per-request", f->max_items_per_request, "most images in one request")
        ->capture_default_str()
        ->check(Integer(1));
    cmd->add_option("--max-request-mb", f->max_request_mb, "largest request message, MB")
        ->capture_default_str()
        ->check(Number(0.001, 2047, "MB"));
    cmd->add_option("--max-buffered-mb", f->max_buffered_mb,
                    "result bytes waiting for slow clients above which no new tower batch starts, MB")
        ->capture_default_str()
        ->check(Number(0.001, 1e9, "MB"));
    cmd->add_option("--max-buffered-mb-per-tenant", f->max_buffered_mb_per_tenant,
                    "one tenant's share of --max-buffered-mb: what it buffers past this never stops the tower; "
                    "0 = a quarter of --max-buffered-mb")
        ->capture_default_str()
        ->check(ZeroOrNumber(0.001, 1e9, "MB"));
    cmd->add_option("--max-reply-mb", f->max_reply_mb,
                    "memory held for replies handed to gRPC and not yet sent, all clients, MB; a reply past it "
                    "ends its call with RESOURCE_EXHAUSTED")
        ->capture_default_str()
        ->check(Number(0.001, 1e9, "MB"));
    cmd->add_option("--max-reply-mb-per-connection", f->max_reply_mb_per_connection,
                    "the same per client connection, MB")
        ->capture_default_str()
        ->check(Number(0.001, 1e9, "MB"));
    cmd->add_option("--write-timeout-s", f->write_timeout_s,
                    "cancel an Encode call whose client accepts no reply bytes for this long, s; 0 = never")
        ->capture_default_str()
        ->check(ZeroOrNumber(0.001, 86400, "s"));
    cmd->add_option("--max-concurrent-streams", f->max_concurrent_streams,
                    "calls one client connection may have open at once (HTTP/2 max_concurrent_streams); "
                    "0 = no limit")
        ->capture_default_str()
        ->check(Integer(0, 1 << 30));
    cmd->add_option("--max-rpc-threads", f->max_rpc_threads,
                    "most handler threads of the sync methods (Health, Stats, Release); Encode calls hold none")
        ->capture_default_str()
        ->check(Integer(2, 100000));
    cmd->add_option("--listen", f->listen,
                    "also listen here: unix:/path (a Unix domain socket, for clients on this host) or host:port; "
                    "repeatable");
    cmd->add_option("--shm-arena-mb", f->shm_arena_mb,
                    "shared-memory arena for clients on this host that ask for it (docs/SHM.md), MiB; 0 = off")
        ->capture_default_str()
        ->check(Number(0, 1 << 20, "MiB"));
    cmd->add_option("--shm-lease-ms", f->shm_lease_ms,
                    "how long a shared-memory reference stays valid without a release, ms")
        ->capture_default_str()
        ->check(Integer(10, 3600000));
    cmd->add_option("--ipc-export-mb", f->ipc_export_mb,
                    "CUDA IPC delivery of device-resident rows to clients on this GPU node that ask for it "
                    "(docs/SHM.md), MiB of live exports at most; 0 = off; needs --device cuda with the GPU tier")
        ->capture_default_str()
        ->check(Number(0, 1 << 20, "MiB"));
    cmd->add_option("--ipc-lease-ms", f->ipc_lease_ms,
                    "how long a CUDA IPC reference stays valid without a release, ms; 0 = --shm-lease-ms")
        ->capture_default_str()
        ->check(Integer(0, 3600000));
    cmd->add_option("--shm-max-sessions", f->shm_max_sessions,
                    "most lease sessions open at once (one per shared-memory client; its leases are released "
                    "when it disconnects); one more is refused")
        ->capture_default_str()
        ->check(Integer(1, 1 << 20));
    cmd->add_option("--max-inflight-request-mb", f->max_inflight_request_mb,
                    "request bytes admitted and not yet finished, MB; a request past it waits briefly, then gets "
                    "RESOURCE_EXHAUSTED (>= --max-request-mb)")
        ->capture_default_str()
        ->check(Number(0.001, 1e9, "MB"));
    cmd->add_option("--tenant-header", f->tenant_header,
                    "metadata key naming a client's fair share under --order fair; empty = by client address only")
        ->capture_default_str();
    AddServerSecurityFlags(*cmd, f->security);
    AddTenantFlags(*cmd, f->tenants);
    AddHttpFrontFlags(*cmd, f->http);
    cmd->callback([f] {
      if (int rc = RunServe(*f); rc != 0) throw CLI::RuntimeError(rc);
    });
  }
  {
    auto f = std::make_shared<ClientFlags>();
    CLI::App* cmd = app.add_subcommand("client", "encode image and video files with a running server");
    cmd->add_option("--server", f->server, "HOST:PORT of a server or of the nginx front, or unix:/path");
    cmd->add_option("--http", f->http,
                    "instead of --server: the base URL of an OpenAI-compatible front (serve --http-port), "
                    "e.g. http://127.0.0.1:8000; sends the files as data: URLs to /v1/chat/completions");
    cmd->add_option("--uuid", f->uuids, "with --http: the uuid of each file's item, in order (repeat the flag)")
        ->allow_extra_args(false);
    cmd->add_option("images", f->images, "image files (JPEG, PNG, ...) and video files (MP4, WebM, AVI)")
        ->required()
        ->check(CLI::ExistingFile);
    cmd->add_flag("--video", f->video, "send every file as a video (default: by its magic bytes)");
    cmd->add_option("--video-fps", f->video_fps, "videos: sampled frames per second [server's default]")
        ->check(Number(0, 1e3, "fps", /*lo_open=*/true));
    cmd->add_option("--out", f->out, "write the embeddings to this safetensors file");
    cmd->add_option("--timeout-s", f->timeout_s, "deadline of each call, seconds")
        ->capture_default_str()
        ->check(Number(0, 1e6, "s", /*lo_open=*/true));
    cmd->add_flag("--no-route", f->no_route, "one call for all images, without the x-epd-route header");
    cmd->add_option("--request-id", f->request_id, "request id [random]");
    cmd->add_flag("--shm", f->shm,
                  "ask for the rows by shared memory (a server on this host, same user, with --shm-arena-mb); "
                  "with --cuda-ipc: the fallback for rows that cannot go by CUDA IPC");
    CLI::Option* ipc = cmd->add_flag(
        "--cuda-ipc", f->cuda_ipc,
        "ask for the rows by CUDA IPC, imported into this node's GPU (a server on the same GPU node with the GPU "
        "tier and --ipc-export-mb; docs/SHM.md); rows that cannot go so come inline, or by shared memory with "
        "--shm. Needs a build with CUDA");
    cmd->add_option("--cuda-device", f->cuda_device, "with --cuda-ipc: the CUDA device that imports the rows")
        ->capture_default_str()
        ->check(Integer(0, 1023))
        ->needs(ipc);
    AddClientSecurityFlags(*cmd, f->security);
    cmd->callback([f] {
      if (int rc = RunClient(*f); rc != 0) throw CLI::RuntimeError(rc);
    });
  }
}

}  // namespace epd::cli
