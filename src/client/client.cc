// EncodeClient: per-key calls with the routing header, reassembled by index.
//
// Grouping is by key in order of first appearance, so the calls a request
// turns into, and their ids, depend only on the request. Duplicate images in
// one request share one call (the server computes them once either way).
#include "epd/client/client.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <future>
#include <map>
#include <random>
#include <utility>

#include "client_convert.h"
#include "client_session.h"
#include "epd/core/mutex.h"
#include "epd/v1/encoder.grpc.pb.h"
#include "epd/v1/service_config.h"
#include "proto_convert.h"
#include "shm_mapping.h"

namespace epd {
namespace {

std::string RandomHex(int digits) {
  std::random_device rd;
  std::mt19937_64 gen((static_cast<std::uint64_t>(rd()) << 32) ^ rd());
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < digits; ++i) s += kHex[gen() & 15];
  return s;
}

// One call's worth of items: their positions in the caller's request.
struct Group {
  std::string route;  // key hex, empty = no routing header
  std::vector<std::int64_t> indices;
};

void SetCallOptions(const ClientOptions& options, grpc::ClientContext& ctx) {
  ctx.set_deadline(std::chrono::system_clock::now() + options.timeout);
  if (!options.auth_token.empty()) ctx.AddMetadata("authorization", "Bearer " + options.auth_token);
  if (!options.tenant.empty()) ctx.AddMetadata(options.tenant_header, options.tenant);
}

// One lease's release, as the Release RPC and EncodeRequest.release carry it
// (CUDA IPC leases have no offset).
v1::ShmLease LeaseMessage(v1::LeaseKind kind, std::uint64_t offset, std::uint64_t generation) {
  v1::ShmLease l;
  l.set_kind(kind);
  l.set_offset(offset);
  l.set_generation(generation);
  return l;
}

}  // namespace

// What a ShmLease needs to release itself, shared with the client (and
// outliving it while leases do): the channel and the queue of releases not
// yet sent.
struct ShmLeaseLink {
  ClientOptions options;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Encoder::Stub> stub;
  Mutex mu;
  std::vector<v1::ShmLease> pending EPD_GUARDED_BY(mu);

  void Queue(std::uint64_t offset, std::uint64_t generation) {
    MutexLock lock(mu);
    pending.push_back(LeaseMessage(v1::LEASE_KIND_SHM, offset, generation));
  }

  // A CUDA IPC lease's release (ShmLease of kind LEASE_KIND_CUDA_IPC).
  void QueueIpc(std::uint64_t generation) {
    MutexLock lock(mu);
    pending.push_back(LeaseMessage(v1::LEASE_KIND_CUDA_IPC, 0, generation));
  }

  std::vector<v1::ShmLease> Take() {
    MutexLock lock(mu);
    return std::exchange(pending, {});
  }

  Status Send(const std::vector<v1::ShmLease>& leases) {
    if (leases.empty()) return Status::Ok();
    v1::ReleaseRequest req;
    for (const v1::ShmLease& l : leases) *req.add_leases() = l;
    grpc::ClientContext ctx;
    SetCallOptions(options, ctx);
    v1::ReleaseResponse resp;
    return internal::FromGrpc(stub->Release(&ctx, req, &resp));
  }
};

ShmLease::ShmLease(std::shared_ptr<const void> mapping, const std::byte* rows, EmbeddingShape shape, GridTHW grid,
                   std::uint64_t offset, std::uint64_t generation, std::chrono::steady_clock::time_point deadline,
                   std::shared_ptr<ShmLeaseLink> link)
    : mapping_(std::move(mapping)),
      rows_(rows),
      shape_(shape),
      grid_(grid),
      offset_(offset),
      generation_(generation),
      deadline_(deadline),
      link_(std::move(link)) {}

ShmLease::~ShmLease() {
  if (!released_ && link_ != nullptr) link_->Queue(offset_, generation_);
}

EmbeddingPtr ShmLease::Copy() const {
  auto e = std::make_shared<Embedding>();
  static_cast<EmbeddingShape&>(*e) = shape_;
  e->grid = grid_;
  e->main.assign(main(), main() + main_bytes());
  e->deepstack.assign(deepstack(), deepstack() + deepstack_bytes());
  return e;
}

Status ShmLease::Release() {
  released_ = true;
  if (link_ == nullptr) return Status::Ok();
  return link_->Send({LeaseMessage(v1::LEASE_KIND_SHM, offset_, generation_)});
}

IpcLease::IpcLease(std::shared_ptr<const IpcImport> imported, EmbeddingShape shape, GridTHW grid,
                   std::uint64_t generation, std::chrono::steady_clock::time_point deadline, std::string device,
                   std::shared_ptr<ShmLeaseLink> link)
    : imported_(std::move(imported)),
      shape_(shape),
      grid_(grid),
      generation_(generation),
      deadline_(deadline),
      device_(std::move(device)),
      link_(std::move(link)) {}

IpcLease::~IpcLease() {
  if (!released_ && link_ != nullptr) link_->QueueIpc(generation_);
}

Status IpcLease::Release() {
  released_ = true;
  if (link_ == nullptr) return Status::Ok();
  return link_->Send({LeaseMessage(v1::LEASE_KIND_CUDA_IPC, 0, generation_)});
}

struct EncodeClient::Impl {
  ClientOptions options;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Encoder::Stub> stub;
  std::string id_prefix = "cli-" + RandomHex(12) + "-";
  std::atomic<std::uint64_t> next_id{1};
  Mutex info_mu;
  std::optional<ServerInfo> info EPD_GUARDED_BY(info_mu);  // Health's answer, fetched once
  std::shared_ptr<ShmLeaseLink> link;
  Mutex map_mu;
  std::map<std::uint64_t, std::shared_ptr<const internal::ShmMapping>> mappings EPD_GUARDED_BY(map_mu);  // by segment
  // The lease session (docs/SHM.md, "Crashed clients"), opened before the
  // first shared-memory or CUDA IPC call and reopened after it ends; after a refusal
  // (no arena, the server's cap, an older server) calls go without one and
  // the next try waits kSessionRetry.
  static constexpr std::chrono::seconds kSessionRetry{1};
  Mutex session_mu;
  std::unique_ptr<internal::ClientSession> session EPD_GUARDED_BY(session_mu);
  std::chrono::steady_clock::time_point session_retry_at EPD_GUARDED_BY(session_mu) = {};

  // The id to send in "x-epd-session"; empty when there is no session.
  std::string SessionId() {
    MutexLock lock(session_mu);
    if (session != nullptr && session->live()) return session->id();
    const auto now = std::chrono::steady_clock::now();
    if (now < session_retry_at) return "";
    session.reset();  // ended (e.g. the server restarted): closes its stream
    StatusOr<std::unique_ptr<internal::ClientSession>> opened = internal::ClientSession::Open(
        *stub, options.auth_token.empty() ? "" : "Bearer " + options.auth_token, options.timeout);
    if (!opened.ok()) {
      session_retry_at = now + kSessionRetry;
      return "";
    }
    session = std::move(*opened);
    return session->id();
  }

  // The arena `ref` points into, mapped on first use.
  StatusOr<std::shared_ptr<const internal::ShmMapping>> Mapping(const v1::ShmRef& ref) {
    MutexLock lock(map_mu);
    auto it = mappings.find(ref.segment());
    if (it != mappings.end() && it->second->size() >= ref.segment_bytes()) return it->second;
    StatusOr<std::shared_ptr<const internal::ShmMapping>> m =
        internal::ShmMapping::Shared(static_cast<pid_t>(ref.pid()), ref.fd(), ref.segment(), ref.segment_bytes());
    if (m.ok()) mappings[ref.segment()] = *m;
    return m;
  }

  // An item sent by reference, as a result whose `shm` reads it in place.
  ClientItemResult FromShm(const v1::EncodedItem& msg) {
    const auto now = std::chrono::steady_clock::now();
    EmbeddingShape shape;
    GridTHW grid;
    ClientItemResult r = internal::FromProtoShm(msg, &shape, &grid);
    if (!r.status.ok()) return r;
    const v1::ShmRef& ref = msg.shm();
    StatusOr<std::shared_ptr<const internal::ShmMapping>> m = Mapping(ref);
    if (!m.ok()) {
      // The server holds the span until the lease ends; hand it back now.
      link->Queue(ref.offset(), ref.generation());
      r.status = m.status();
      return r;
    }
    r.shm = std::make_shared<ShmLease>(*m, (*m)->data() + ref.offset(), shape, grid, ref.offset(), ref.generation(),
                                       now + std::chrono::milliseconds(ref.lease_ms()), link);
    return r;
  }

  // Live imports by handle (memory handle bytes and length), so that leases
  // on one export share one mapping (a CUDA context may open a handle once).
  Mutex import_mu;
  std::map<std::string, std::weak_ptr<const IpcImport>> imports EPD_GUARDED_BY(import_mu);

  StatusOr<std::shared_ptr<const IpcImport>> Import(const IpcHandle& handle) {
    std::string id(reinterpret_cast<const char*>(handle.memory.data()), handle.memory.size());
    id += std::to_string(handle.bytes);
    MutexLock lock(import_mu);
    for (auto it = imports.begin(); it != imports.end();) {  // drop entries of closed imports
      it = it->second.expired() ? imports.erase(it) : std::next(it);
    }
    if (auto it = imports.find(id); it != imports.end()) {
      if (std::shared_ptr<const IpcImport> live = it->second.lock()) return live;
    }
    StatusOr<std::unique_ptr<IpcImport>> imported = options.ipc_device->ImportIpc(handle);
    if (!imported.ok()) return imported.status();
    std::shared_ptr<const IpcImport> shared(std::move(*imported));
    imports[id] = shared;
    return shared;
  }

  // An item sent by CUDA IPC, as a result whose `ipc` holds the import.
  ClientItemResult FromIpc(const v1::EncodedItem& msg) {
    const auto now = std::chrono::steady_clock::now();
    EmbeddingShape shape;
    GridTHW grid;
    IpcHandle handle;
    ClientItemResult r = internal::FromProtoIpc(msg, &shape, &grid, &handle);
    const v1::CudaIpcRef& ref = msg.cuda_ipc();
    if (!r.status.ok()) {
      if (msg.error_code() == 0) link->QueueIpc(ref.generation());  // the server holds a lease: hand it back
      return r;
    }
    StatusOr<std::shared_ptr<const IpcImport>> imported = Import(handle);
    if (!imported.ok()) {
      link->QueueIpc(ref.generation());
      r.status = Status(imported.status().code(), "importing the CUDA IPC rows from " + ref.device() + " (pid " +
                                                      std::to_string(ref.pid()) + "): " + imported.status().message());
      return r;
    }
    r.ipc = std::make_shared<IpcLease>(*imported, shape, grid, ref.generation(),
                                       now + std::chrono::milliseconds(ref.lease_ms()), ref.device(), link);
    return r;
  }

  // Every call's deadline and, when set, the bearer token.
  void SetDeadline(grpc::ClientContext& ctx) const { SetCallOptions(options, ctx); }

  StatusOr<ServerInfo> FetchHealth() {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    v1::HealthResponse resp;
    grpc::Status s = stub->Health(&ctx, v1::HealthRequest(), &resp);
    if (!s.ok()) return internal::FromGrpc(s);
    ServerInfo info;
    info.serving = resp.serving();
    info.server_id = resp.server_id();
    info.model_id = resp.model_id();
    StatusOr<PreprocessConfig> cfg = internal::FromProto(resp.preprocess());
    if (!cfg.ok()) return Internal("server's Health: " + cfg.status().message());
    info.preprocess = *cfg;
    // A server that names no mode (or one unknown here) keys with SHA-256.
    const StatusOr<KeyMode> key_mode = ParseKeyMode(resp.key_mode());
    info.key_mode = key_mode.ok() ? *key_mode : KeyMode::kSha256;
    info.tower = resp.tower();
    info.hidden = resp.hidden();
    info.deepstack_layers = resp.deepstack_layers();
    StatusOr<DType> dtype = internal::FromProto(resp.dtype());
    info.dtype = dtype.ok() ? *dtype : DType::kFloat32;
    info.version = resp.version();
    info.l3 = resp.l3();
    return info;
  }

  StatusOr<ServerInfo> CachedInfo() {
    MutexLock lock(info_mu);
    if (info.has_value()) return *info;
    StatusOr<ServerInfo> fresh = FetchHealth();
    if (fresh.ok()) info = *fresh;
    return fresh;
  }

  static void ToProto(const ClientItem& item, v1::EncodeItem* m) {
    m->set_image(item.image);
    if (item.caller_key.has_value()) m->set_caller_key(*item.caller_key);
    m->set_expected_tokens(item.expected_tokens);
    m->set_public_(item.is_public);
    m->set_video(item.video);
    for (const std::string& f : item.video_frames) m->mutable_video_frames()->add_frames(f);
    if (item.sampling.has_value()) internal::ToProto(*item.sampling, m->mutable_sampling());
  }

  static StatusOr<ContentKey> Key(const ServerInfo& info, const ClientItem& item) {
    if (item.is_video()) {
      std::vector<std::span<const std::uint8_t>> parts;
      auto span = [](const std::string& s) {
        return std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(s.data()), s.size());
      };
      const bool frames = item.video.empty();
      if (frames) {
        for (const std::string& f : item.video_frames) parts.push_back(span(f));
      } else {
        parts.push_back(span(item.video));
      }
      return ComputeVideoKey(info.model_id, info.preprocess, item.sampling.value_or(VideoSampling{}), parts, frames,
                             info.key_mode);
    }
    if (item.caller_key.has_value()) return CallerContentKey(info.model_id, info.preprocess, *item.caller_key);
    const auto* p = reinterpret_cast<const std::uint8_t*>(item.image.data());
    return ComputeContentKey(info.model_id, info.preprocess, {p, item.image.size()}, info.key_mode);
  }

  // Runs one call for `group` and fills the group's slots of `out`.
  void Call(const std::string& id, const Group& group, const std::vector<ClientItem>& items,
            std::vector<ClientItemResult>& out) {
    v1::EncodeRequest req;
    req.set_id(id);
    if (options.delivery == Delivery::kShm) req.set_delivery(v1::DELIVERY_SHM);
    if (options.delivery == Delivery::kCudaIpc) {
      req.set_delivery(v1::DELIVERY_CUDA_IPC);
      req.set_ipc_fallback_shm(options.ipc_fallback_shm);
    }
    for (v1::ShmLease& l : link->Take()) *req.add_release() = std::move(l);
    for (std::int64_t i : group.indices) ToProto(items[i], req.add_items());
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    if (!group.route.empty()) ctx.AddMetadata(internal::kRouteHeader, group.route);
    if (options.delivery == Delivery::kShm || options.delivery == Delivery::kCudaIpc) {
      if (const std::string session_id = SessionId(); !session_id.empty()) {
        ctx.AddMetadata(internal::kSessionHeader, session_id);
      }
    }
    std::vector<bool> got(group.indices.size(), false);
    std::unique_ptr<grpc::ClientReader<v1::EncodedItem>> reader = stub->Encode(&ctx, req);
    v1::EncodedItem msg;
    while (reader->Read(&msg)) {
      const std::int64_t local = msg.index();
      if (local < 0 || local >= static_cast<std::int64_t>(group.indices.size()) || got[local]) continue;
      got[local] = true;
      ClientItemResult r = msg.has_cuda_ipc() ? FromIpc(msg) : msg.has_shm() ? FromShm(msg) : internal::FromProto(msg);
      r.index = group.indices[local];
      // The server's message says what is wrong; name the item by its place
      // in the caller's request (not in this per-key call).
      if (!r.status.ok()) {
        r.status = Status(r.status.code(), "item " + std::to_string(r.index) + ": " + r.status.message());
      }
      out[r.index] = std::move(r);
    }
    const Status call = internal::FromGrpc(reader->Finish());
    for (std::size_t k = 0; k < got.size(); ++k) {
      if (got[k]) continue;
      ClientItemResult& r = out[group.indices[k]];
      r.index = group.indices[k];
      r.status =
          call.ok() ? Internal("the server ended the call without sending item " + std::to_string(r.index)) : call;
    }
  }
};

EncodeClient::EncodeClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
EncodeClient::~EncodeClient() {
  if (impl_ == nullptr) return;
  if (impl_->link != nullptr) (void)FlushReleases();
  // Ends the lease session: the server releases every lease still under it.
  MutexLock lock(impl_->session_mu);
  impl_->session.reset();
}

Status EncodeClient::FlushReleases() { return impl_->link->Send(impl_->link->Take()); }

StatusOr<std::unique_ptr<EncodeClient>> EncodeClient::Connect(ClientOptions options) {
  if (Status s = options.Validate(); !s.ok()) return s;
  const bool tls = options.tls || !options.tls_root_certs_pem.empty() || !options.tls_client_cert_pem.empty();
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(options.max_response_bytes));
  args.SetMaxSendMessageSize(-1);
  // A private subchannel pool: each client gets its own HTTP/2 connection
  // rather than sharing one with every channel to the same target, so a
  // caller can spread load over several connections (one connection's
  // transport is processed serially).
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // Encode's retry policy (proto/epd/v1/encoder_service_config.json): a call
  // refused before any item came back (UNAVAILABLE, or CANCELLED by a server
  // whose shutdown began as the call arrived) is sent again, to another
  // server behind a front. Requests up to v1::kRetryBufferBytes stay
  // retryable (both from cmake/epd_service_config.cmake).
  args.SetServiceConfigJSON(v1::kEncoderServiceConfig);
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 1);
  args.SetInt(GRPC_ARG_PER_RPC_RETRY_BUFFER_SIZE, v1::kRetryBufferBytes);
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (tls) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options.tls_root_certs_pem;
    ssl.pem_private_key = options.tls_client_key_pem;
    ssl.pem_cert_chain = options.tls_client_cert_pem;
    credentials = grpc::SslCredentials(ssl);
    if (!options.tls_server_name.empty()) args.SetSslTargetNameOverride(options.tls_server_name);
  }
  impl->channel = grpc::CreateCustomChannel(options.target, credentials, args);
  impl->stub = v1::Encoder::NewStub(impl->channel);
  impl->link = std::make_shared<ShmLeaseLink>();
  impl->link->options = std::move(options);  // its last use
  impl->link->channel = impl->channel;
  impl->link->stub = v1::Encoder::NewStub(impl->channel);
  return std::unique_ptr<EncodeClient>(new EncodeClient(std::move(impl)));
}

StatusOr<ServerInfo> EncodeClient::Health() { return impl_->FetchHealth(); }

StatusOr<ServerStats> EncodeClient::Stats() {
  grpc::ClientContext ctx;
  impl_->SetDeadline(ctx);
  v1::StatsResponse resp;
  grpc::Status s = impl_->stub->Stats(&ctx, v1::StatsRequest(), &resp);
  if (!s.ok()) return internal::FromGrpc(s);
  return internal::FromProto(resp);
}

StatusOr<ContentKey> EncodeClient::KeyFor(const ClientItem& item) {
  StatusOr<ServerInfo> info = impl_->CachedInfo();
  if (!info.ok()) return info.status();
  return Impl::Key(*info, item);
}

ProbeResult EncodeClient::Probe(const std::vector<ClientItem>& items) {
  ProbeResult result;
  if (items.empty()) {
    result.status = InvalidArgument("the request has no items; send at least one image");
    return result;
  }
  v1::EncodeRequest req;
  for (const ClientItem& item : items) Impl::ToProto(item, req.add_items());
  grpc::ClientContext ctx;
  impl_->SetDeadline(ctx);
  v1::ProbeResponse resp;
  const Status call = internal::FromGrpc(impl_->stub->Probe(&ctx, req, &resp));
  result.server_id = resp.server_id();
  result.items.resize(items.size());
  for (std::size_t i = 0; i < items.size(); ++i) {
    result.items[i].index = static_cast<std::int64_t>(i);
    result.items[i].status = call.ok() ? Internal("the server's probe reply has no item " + std::to_string(i)) : call;
  }
  for (const v1::ProbedItem& m : resp.items()) {
    if (m.index() < 0 || m.index() >= static_cast<std::int64_t>(items.size())) continue;
    result.items[static_cast<std::size_t>(m.index())] = internal::FromProto(m);
  }
  for (const ClientProbeItem& r : result.items) {
    if (!r.status.ok()) {
      result.status = r.status;
      break;
    }
  }
  return result;
}

EncodeResult EncodeClient::Encode(std::vector<ClientItem> items, const std::string& request_id) {
  EncodeResult result;
  if (items.empty()) {
    result.status = InvalidArgument("the request has no items; send at least one image");
    return result;
  }
  result.items.resize(items.size());
  const std::string id =
      request_id.empty() ? impl_->id_prefix + std::to_string(impl_->next_id.fetch_add(1)) : request_id;

  std::vector<Group> groups;
  if (!impl_->options.route_by_key) {
    Group all;
    for (std::size_t i = 0; i < items.size(); ++i) all.indices.push_back(static_cast<std::int64_t>(i));
    groups.push_back(std::move(all));
  } else {
    StatusOr<ServerInfo> info = impl_->CachedInfo();
    if (!info.ok()) {
      for (std::size_t i = 0; i < items.size(); ++i) {
        result.items[i].index = static_cast<std::int64_t>(i);
        result.items[i].status = info.status();
      }
      result.status = info.status();
      return result;
    }
    std::map<std::string, std::size_t> by_route;
    for (std::size_t i = 0; i < items.size(); ++i) {
      StatusOr<ContentKey> key = Impl::Key(*info, items[i]);
      // An item without a key (empty caller key) goes unrouted; the server
      // names the problem.
      const std::string route = key.ok() ? key->Hex() : std::string();
      auto [it, inserted] = by_route.emplace(route, groups.size());
      if (inserted) groups.push_back(Group{route, {}});
      groups[it->second].indices.push_back(static_cast<std::int64_t>(i));
    }
  }

  auto call_id = [&](std::size_t g) { return groups.size() == 1 ? id : id + "/" + std::to_string(g); };
  std::vector<std::future<void>> others;
  for (std::size_t g = 1; g < groups.size(); ++g) {
    others.push_back(
        std::async(std::launch::async, [&, g] { impl_->Call(call_id(g), groups[g], items, result.items); }));
  }
  impl_->Call(call_id(0), groups[0], items, result.items);
  for (std::future<void>& f : others) f.get();

  for (const ClientItemResult& r : result.items) {
    if (!r.status.ok()) {
      result.status = r.status;
      break;
    }
  }
  return result;
}

std::string GrpcStatusName(StatusCode code) { return internal::GrpcCodeName(static_cast<int>(code)); }

}  // namespace epd
