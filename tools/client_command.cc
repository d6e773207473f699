// `epd-encode client`: encodes image and video files with a running server
// (docs/SERVER.md). With --http URL: through the OpenAI-compatible front
// (tools/http_client.h); otherwise over gRPC. A video is recognised by its
// container's magic bytes (MP4/MOV, WebM/Matroska, AVI), or forced with
// --video. One stdout line per item:
//   index=<i> key=<hex> tokens=<n> hidden=<h> source=<l1|l2|l3|miss|joined> ms=<server ms> server=<id>
//   delivery=<inline|shm|cuda_ipc>
// an item that came by CUDA IPC (--cuda-ipc) adds
//   device=<the server's exporting device> bytes=<main + deepstack> dtype=<d> deepstack_layers=<n>
// and a video has a second line "index=<i> grid=<t>x<h>x<w> frames=<n> seconds_per_grid_t=<s>".
// --out FILE writes the embeddings as safetensors (epd/worker/safetensors.h;
// rows by CUDA IPC are copied to the host for it). Leases (--shm,
// --cuda-ipc) are released together in one Release call once every item is
// printed. A failure prints "<CODE_NAME>: <message>" on stderr and exits 1.
// --cuda-ipc needs a build with CUDA (EPD_WITH_CUDA) and a CUDA device;
// otherwise it fails before any call, naming why.
//
// Exit codes: 0 success; 1 a call or item failed, setup failed, or a usage
// error (main.cc maps every CLI11 parse error to 1).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>

#include "cli_util.h"
#include "commands.h"
#include "epd/client/client.h"
#include "epd/gpu/device.h"
#include "epd/worker/safetensors.h"
#include "flag_checks.h"
#include "http_client.h"
#include "security_flags.h"
#include "server_commands.h"
#ifdef EPD_CLIENT_WITH_CUDA
#include "epd/gpu_cuda/cuda_device.h"
#endif

namespace epd::cli {
namespace {

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

// Fills `to` from the device rows at `from`: one device-to-host copy on the
// offload stream, none when `to` is empty.
Status CopyRowsToHost(Device& device, std::vector<std::byte>& to, const std::byte* from) {
  if (to.empty()) return Status::Ok();
  return device.CopyAsync(to.data(), from, to.size(), CopyKind::kDeviceToHost, Stream::kOffload);
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
  if (Status s = CopyRowsToHost(device, e->main, lease.main()); !s.ok()) return s;
  if (Status s = CopyRowsToHost(device, e->deepstack, lease.deepstack()); !s.ok()) return s;
  if (Status s = device.Synchronize(Stream::kOffload); !s.ok()) return s;
  return EmbeddingPtr(std::move(e));
}

// --http: the files go through the OpenAI-compatible front instead.
int RunHttpClientCommand(const ClientFlags& f) {
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

// One item per file, a video by --video or by its magic bytes.
std::vector<ClientItem> ReadClientItems(const ClientFlags& f) {
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
  return items;
}

// The connection's options; `ipc_device` is null without --cuda-ipc.
ClientOptions MakeClientOptions(const ClientFlags& f, Device* ipc_device) {
  ClientOptions co;
  co.target = f.server;
  co.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(f.timeout_s * 1000));
  co.route_by_key = !f.no_route;
  co.delivery = f.shm ? Delivery::kShm : Delivery::kInline;
  if (f.cuda_ipc) {
    // With --shm too, items that cannot go by CUDA IPC come by shared memory.
    co.delivery = Delivery::kCudaIpc;
    co.ipc_device = ipc_device;
    co.ipc_fallback_shm = f.shm;
  }
  if (Status s = ApplyClientSecurityFlags(f.security, co); !s.ok()) FailCommand(1, s.message());
  return co;
}

// A video item's second line.
void PrintGridLine(const ClientItemResult& item, const GridTHW& g) {
  std::printf("index=%lld grid=%lldx%lldx%lld frames=%zu seconds_per_grid_t=%.6g\n", static_cast<long long>(item.index),
              static_cast<long long>(g.t), static_cast<long long>(g.h), static_cast<long long>(g.w),
              item.video->timestamps_s.size(), item.video->seconds_per_grid_t);
}

// An item that came by CUDA IPC: printed once the server's copy into this
// node's GPU memory has landed, and copied to the host for --out. False,
// with the reason on stderr, when either fails.
bool PrintIpcItem(const ClientFlags& f, Device& device, const ClientItemResult& item,
                  std::vector<KeyedEmbedding>& out) {
  if (Status s = item.ipc->WaitReady(); !s.ok()) {
    std::fprintf(stderr, "index=%lld %s: the CUDA IPC rows did not land: %s\n", static_cast<long long>(item.index),
                 GrpcStatusName(s.code()).c_str(), s.message().c_str());
    return false;
  }
  const EmbeddingShape& e = item.ipc->shape();
  std::printf(
      "index=%lld key=%s tokens=%lld hidden=%lld source=%s ms=%.3f server=%s delivery=cuda_ipc "
      "device=%s bytes=%zu dtype=%s deepstack_layers=%lld\n",
      static_cast<long long>(item.index), item.key.Hex().c_str(), static_cast<long long>(e.tokens),
      static_cast<long long>(e.hidden), std::string(ItemSourceName(item.source)).c_str(), item.total_ms,
      item.server_id.c_str(), item.ipc->server_device().c_str(), item.ipc->nbytes(),
      std::string(DTypeName(e.dtype)).c_str(), static_cast<long long>(e.deepstack_layers));
  if (item.video != nullptr) PrintGridLine(item, item.ipc->grid());
  if (f.out.empty()) return true;
  StatusOr<EmbeddingPtr> host = CopyIpcToHost(device, *item.ipc);
  if (!host.ok()) {
    std::fprintf(stderr, "index=%lld %s: copying the CUDA IPC rows to the host for --out: %s\n",
                 static_cast<long long>(item.index), GrpcStatusName(host.status().code()).c_str(),
                 host.status().message().c_str());
    return false;
  }
  out.push_back({item.key, std::move(*host)});
  return true;
}

// An item that came inline or by shared memory; rows sent by reference are
// copied out of the arena only for --out.
void PrintHostItem(const ClientFlags& f, const ClientItemResult& item, std::vector<KeyedEmbedding>& out) {
  const EmbeddingShape& e = item.shm != nullptr ? item.shm->shape() : item.embedding->shape();
  std::printf("index=%lld key=%s tokens=%lld hidden=%lld source=%s ms=%.3f server=%s delivery=%s\n",
              static_cast<long long>(item.index), item.key.Hex().c_str(), static_cast<long long>(e.tokens),
              static_cast<long long>(e.hidden), std::string(ItemSourceName(item.source)).c_str(), item.total_ms,
              item.server_id.c_str(), item.shm != nullptr ? "shm" : "inline");
  if (item.video != nullptr) PrintGridLine(item, item.shm != nullptr ? item.shm->grid() : item.embedding->grid);
  if (!f.out.empty()) out.push_back({item.key, item.shm != nullptr ? item.shm->Copy() : item.embedding});
}

// Prints every item (failed ones on stderr when there are several: the
// final line always carries the lowest-index failure); 1 when an item by
// CUDA IPC could not be printed or copied, else 0.
int PrintClientItems(const ClientFlags& f, Device* ipc_device, const EncodeResult& r,
                     std::vector<KeyedEmbedding>& out) {
  int rc = 0;
  for (const ClientItemResult& item : r.items) {
    if (item.status.ok() && item.ipc != nullptr) {
      if (!PrintIpcItem(f, *ipc_device, item, out)) rc = 1;
    } else if (!item.status.ok()) {
      if (r.items.size() > 1) {
        std::fprintf(stderr, "index=%lld %s: %s\n", static_cast<long long>(item.index),
                     GrpcStatusName(item.status.code()).c_str(), item.status.message().c_str());
      }
    } else {
      PrintHostItem(f, item, out);
    }
  }
  std::fflush(stdout);
  return rc;
}

// Every lease (--shm, --cuda-ipc) goes back now, in one Release call: the
// rows were printed or copied. A refusal (a lease that expired meanwhile)
// costs nothing, so it is only reported.
void ReleaseLeases(EncodeClient& client, EncodeResult& r) {
  const bool leased = std::any_of(r.items.begin(), r.items.end(), [](const ClientItemResult& item) {
    return item.shm != nullptr || item.ipc != nullptr;
  });
  for (ClientItemResult& item : r.items) {
    item.shm.reset();
    item.ipc.reset();
  }
  if (leased) {
    if (Status s = client.FlushReleases(); !s.ok()) spdlog::warn("releasing the leases: {}", s.ToString());
  }
}

// --out: the embeddings, with the server and its model id as metadata.
void WriteClientOut(const ClientFlags& f, EncodeClient& client, const std::vector<KeyedEmbedding>& out) {
  if (f.out.empty() || out.empty()) return;
  std::map<std::string, std::string> meta = {{"server", f.server}};
  if (StatusOr<ServerInfo> info = client.Health(); info.ok()) meta["model_id"] = info->model_id;
  if (Status s = WriteEmbeddingsSafetensors(f.out, out, meta); !s.ok()) FailCommand(1, "--out: " + s.ToString());
}

int RunClient(const ClientFlags& f) {
  TuneMalloc(MallocUse::kMessages);
  if (f.server.empty() == f.http.empty())
    FailCommand(1, "give exactly one of --server HOST:PORT (gRPC) and --http URL");
  if (!f.http.empty()) return RunHttpClientCommand(f);
  if (!f.uuids.empty()) FailCommand(1, "--uuid goes with --http");
  // Declared before the client and the results, so it outlives both and
  // every IpcLease they hold (ClientOptions::ipc_device).
  std::unique_ptr<Device> ipc_device;
  if (f.cuda_ipc) {
    StatusOr<std::unique_ptr<Device>> dev = OpenIpcDevice(f);
    if (!dev.ok()) FailCommand(1, dev.status().ToString());
    ipc_device = std::move(*dev);
  }
  std::vector<ClientItem> items = ReadClientItems(f);
  StatusOr<std::unique_ptr<EncodeClient>> client = EncodeClient::Connect(MakeClientOptions(f, ipc_device.get()));
  if (!client.ok()) FailCommand(1, client.status().ToString());

  EncodeResult r = (*client)->Encode(std::move(items), f.request_id);
  std::vector<KeyedEmbedding> out;
  const int rc = PrintClientItems(f, ipc_device.get(), r, out);
  ReleaseLeases(**client, r);
  WriteClientOut(f, **client, out);
  if (!r.status.ok()) {
    std::fprintf(stderr, "%s: %s\n", GrpcStatusName(r.status.code()).c_str(), r.status.message().c_str());
    return 1;
  }
  return rc;
}

}  // namespace

void RegisterClientCommand(CLI::App& app) {
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

}  // namespace epd::cli
