// epd/client/client.h: a C++ client of the encode server (proto/epd/v1/encoder.proto).
//
// EncodeClient sends images and returns one result per image. What it adds to
// a bare gRPC stub is hash-affinity routing: it derives each image's content
// key itself, with the server's own function (ComputeContentKey or
// CallerContentKey over the model id and preprocessing the server reports in
// Health), groups the images by key, sends one call per distinct key with
// the key's hex in the "x-epd-route" metadata header (nginx hashes it to pick
// a server, deploy/nginx/), runs the calls concurrently and reassembles the
// results by index. So each image always reaches the server whose cache holds
// it. With route_by_key off, the whole request goes in one call.
//
// Errors: Encode returns per-item statuses; EncodeResult::status is OK when
// every item has an embedding, else the lowest-index failed item's status
// (the gRPC code maps one-to-one onto StatusCode; the message is the
// server's, prefixed "item <i>: " with i the item's place in `items`). A
// call that fails as a whole (UNAVAILABLE, DEADLINE_EXCEEDED,
// INVALID_ARGUMENT for a malformed request...) fails each of its items with
// that status. Health/Stats return the call's status.
//
// Cost: one SHA-256 pass over each image on the calling thread, one call per
// distinct key (extra ones on std::async threads), one copy of each embedding
// out of the response message.
//
// Thread safety: thread-safe; one client (one HTTP/2 connection) may be
// shared by many threads. One connection's transport work is serial, so for
// hundreds of MB/s of embeddings use a few clients.
//
// Example:
//   auto client = epd::EncodeClient::Connect({.target = "127.0.0.1:50051"});
//   epd::EncodeResult r = (*client)->Encode({{jpeg_bytes}});
//   if (!r.status.ok()) return r.status;
//   use(r.items[0].embedding->main);   // [tokens, hidden], dtype
//   use(r.items[0].embedding->grid);   // (t, h, w) for prefill's M-RoPE
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "epd/core/embedding.h"
#include "epd/core/encode_types.h"
#include "epd/core/status.h"
#include "epd/gpu/device.h"
#include "epd/media/content_key.h"
#include "epd/media/preprocess.h"
#include "epd/media/video.h"
#include "epd/rpc/server_stats.h"

namespace epd {

// How the server sends an item's rows (proto Delivery, docs/SHM.md).
enum class Delivery {
  kInline,  // bytes in the reply, copied into ClientItemResult::embedding
  // A reference into the server's shared-memory arena, read in place through
  // ClientItemResult::shm. Needs the server on the same host, run by the same
  // user, with --shm-arena-mb; otherwise (or when its arena is full) items
  // come inline. The client holds a lease session (docs/SHM.md, "Crashed
  // clients") for its leases: opened before its first call, so if this
  // process dies the server reclaims them at once rather than at expiry.
  kShm,
  // A CUDA IPC reference to a copy of the rows in the server's GPU memory,
  // imported through ClientOptions::ipc_device into ClientItemResult::ipc
  // (docs/SHM.md, "CUDA IPC"). Needs a server on the same GPU node with a
  // GPU tier and --ipc-export-mb. Rows that are not device-resident, or
  // past the server's export bound, come by shared memory (when
  // ipc_fallback_shm and the server has an arena) or inline. The client
  // holds a lease session for these leases too, as kShm does.
  kCudaIpc,
};

struct ClientOptions {
  // "host:port" of a server or of the nginx front, or "unix:/path" (a Unix
  // domain socket; also "unix:///abs/path").
  std::string target;
  // Asked for on every Encode call.
  Delivery delivery = Delivery::kInline;
  // Deadline of each call (Encode's per-key calls, Health, Stats).
  std::chrono::milliseconds timeout{30000};
  // Split requests per content key and set "x-epd-route" (see above).
  bool route_by_key = true;
  // Largest response message accepted, bytes. An item's message is about its
  // embedding's size (e.g. 2 MB for 324 tokens x 512 x 3 float32 halves).
  std::int64_t max_response_bytes = std::int64_t{256} << 20;
  // TLS. Off unless `tls` is set or any PEM below is given. PEM text, not
  // paths. Empty root certificates = the system's trust store.
  bool tls = false;
  std::string tls_root_certs_pem{};   // CA(s) the server's certificate must chain to
  std::string tls_client_cert_pem{};  // for mutual TLS, with its key
  std::string tls_client_key_pem{};
  // Name checked against the server's certificate instead of the target's
  // host (e.g. a certificate for "encoder.internal" reached by IP). Testing
  // and private networks only.
  std::string tls_server_name{};
  // Non-empty: sent on every call as "authorization: Bearer <auth_token>".
  std::string auth_token{};
  // Non-empty: sent on every call under `tenant_header`. It names the tenant
  // only on a server with --trust-tenant-header and no credential naming one
  // (docs/SECURITY.md); elsewhere it names the fair order's share at most.
  std::string tenant{};
  std::string tenant_header = "x-epd-tenant";
  // Delivery::kCudaIpc: the Device that imports the rows (a CUDA device of
  // this node, or a FakeDevice for a server running on one). Not owned; it
  // must outlive the client and every IpcLease it returns. Required for
  // kCudaIpc (Connect: kInvalidArgument without it).
  Device* ipc_device = nullptr;
  // Delivery::kCudaIpc: items that cannot go by CUDA IPC come by shared
  // memory (ClientItemResult::shm) when the server has an arena, rather than
  // inline.
  bool ipc_fallback_shm = true;
};

// What Health reports, and what key derivation needs.
struct ServerInfo {
  bool serving = false;
  std::string server_id;
  std::string model_id;
  PreprocessConfig preprocess;
  KeyMode key_mode = KeyMode::kSha256;
  std::string tower;
  std::int64_t hidden = 0;
  std::int64_t deepstack_layers = 0;
  DType dtype = DType::kFloat32;
  std::string version;  // the server's epd-encode version (epd/core/version.h); empty if it reports none
  std::string l3;       // the shared tier: "off", "ok" or "degraded" (docs/L3.md); empty from older servers
};

// One image or video to encode (mirrors EncodeItemInput). A video sets
// `video` (container bytes) or `video_frames` (encoded frame images), not
// `image` or `caller_key`. Its route key is ComputeVideoKey over its bytes
// with `sampling` (or VideoSampling{} when unset): deterministic, so a repeat
// reaches the server that cached it; it equals the server's own content key
// when the server's default sampling is VideoSampling{}.
struct ClientItem {
  // (Every member has an initializer, so ClientItem{bytes} names the rest.)
  std::string image{};                      // JPEG, PNG, WebP, GIF or BMP bytes
  std::optional<std::string> caller_key{};  // see EncodeItemInput::caller_key (epd/worker/encode_worker.h)
  std::int64_t expected_tokens = 0;         // 0 = unknown
  std::string video{};                      // MP4, WebM, ... bytes (docs/VIDEO.md)
  std::vector<std::string> video_frames{};  // or a video as its frames
  std::optional<VideoSampling> sampling{};  // per-request sampling; unset = the server's default
  // Shareable across tenants: keyed in the "public" namespace when the
  // server lists this client's tenant in --public-readers (docs/SECURITY.md).
  bool is_public = false;

  bool is_video() const { return !video.empty() || !video_frames.empty(); }
};

struct ShmLeaseLink;  // internal: the client's release queue, shared with its leases

// An item's rows read in place from the server's shared-memory arena, under a
// lease (docs/SHM.md). main() is [tokens, hidden] and deepstack() is [tokens,
// hidden * deepstack_layers], row-major, in shape().dtype, valid until the
// lease is released or expires (the server's --shm-lease-ms after the reply;
// lease_deadline()). Read or copy them before then: past it, the server may
// overwrite the span. The mapping itself stays valid as long as this object
// lives (so a late read returns wrong bytes, never a fault).
//
// Destroying the lease queues its release; the queue rides on the client's
// next Encode call, or goes at once with EncodeClient::FlushReleases (and at
// the client's destruction). Release() sends it now. Destroying the
// EncodeClient ends its lease session, which ends every lease it still holds:
// a ShmLease that outlives its client keeps its mapping, but the server may
// overwrite its rows at once (copy them first, Copy()).
// Thread safety: thread-compatible; the bytes are read-only.
class ShmLease {
 public:
  ShmLease(std::shared_ptr<const void> mapping, const std::byte* rows, EmbeddingShape shape, GridTHW grid,
           std::uint64_t offset, std::uint64_t generation, std::chrono::steady_clock::time_point deadline,
           std::shared_ptr<ShmLeaseLink> link);
  ~ShmLease();
  ShmLease(const ShmLease&) = delete;
  ShmLease& operator=(const ShmLease&) = delete;

  const std::byte* main() const { return rows_; }
  std::size_t main_bytes() const { return shape_.main_bytes(); }
  const std::byte* deepstack() const { return rows_ + shape_.main_bytes(); }
  std::size_t deepstack_bytes() const { return shape_.deepstack_bytes(); }
  const EmbeddingShape& shape() const { return shape_; }
  const GridTHW& grid() const { return grid_; }
  std::uint64_t offset() const { return offset_; }
  std::uint64_t generation() const { return generation_; }
  std::chrono::steady_clock::time_point lease_deadline() const { return deadline_; }

  // An owned host copy of the rows (one copy of nbytes).
  EmbeddingPtr Copy() const;
  // Sends the release now (a Release call). kFailedPrecondition when the
  // server refused it (the lease expired, or was released already: a second
  // Release() asks again and is refused); the call's error otherwise.
  Status Release();

 private:
  std::shared_ptr<const void> mapping_;  // keeps the arena mapped
  const std::byte* rows_;
  EmbeddingShape shape_;
  GridTHW grid_;
  std::uint64_t offset_, generation_;
  std::chrono::steady_clock::time_point deadline_;
  std::shared_ptr<ShmLeaseLink> link_;
  bool released_ = false;
};

// An item's rows imported by CUDA IPC from the server's GPU memory, under a
// lease (docs/SHM.md, "CUDA IPC"). data() is device memory of
// ClientOptions::ipc_device (host-addressable only for a FakeDevice):
// main() is [tokens, hidden] and deepstack() [tokens, hidden *
// deepstack_layers], row-major, in shape().dtype. Call WaitReady() before
// the first read (it waits for the server's copy into the shared memory);
// the rows stay valid until the lease is released or expires (the server's
// lease time after the reply; lease_deadline()), then the server frees them.
// Two leases on the same export share one import.
//
// Destroying the lease unmaps the rows (when no other lease shares the
// import) and queues its release, as ShmLease does; Release() sends it now.
// Thread safety: thread-compatible; the rows are read-only.
class IpcLease {
 public:
  IpcLease(std::shared_ptr<const IpcImport> imported, EmbeddingShape shape, GridTHW grid, std::uint64_t generation,
           std::chrono::steady_clock::time_point deadline, std::string device, std::shared_ptr<ShmLeaseLink> link);
  ~IpcLease();
  IpcLease(const IpcLease&) = delete;
  IpcLease& operator=(const IpcLease&) = delete;

  // The rows: main then deepstack, nbytes() in all, in device memory.
  const std::byte* data() const { return imported_->data(); }
  std::size_t nbytes() const { return shape_.nbytes(); }
  const std::byte* main() const { return data(); }
  std::size_t main_bytes() const { return shape_.main_bytes(); }
  const std::byte* deepstack() const { return data() + shape_.main_bytes(); }
  std::size_t deepstack_bytes() const { return shape_.deepstack_bytes(); }
  const EmbeddingShape& shape() const { return shape_; }
  DType dtype() const { return shape_.dtype; }
  const GridTHW& grid() const { return grid_; }
  std::uint64_t generation() const { return generation_; }
  std::chrono::steady_clock::time_point lease_deadline() const { return deadline_; }
  // The exporting device as the server names it (CudaIpcRef.device).
  const std::string& server_device() const { return device_; }

  // Blocks until the server's copy of the rows has landed (IpcImport::
  // WaitReady; kInternal for a device failure).
  Status WaitReady() const { return imported_->WaitReady(); }
  // Sends the release now (a Release call). kFailedPrecondition when the
  // server refused it (expired, or released already); the call's error
  // otherwise.
  Status Release();

 private:
  std::shared_ptr<const IpcImport> imported_;
  EmbeddingShape shape_;
  GridTHW grid_;
  std::uint64_t generation_;
  std::chrono::steady_clock::time_point deadline_;
  std::string device_;
  std::shared_ptr<ShmLeaseLink> link_;
  bool released_ = false;
};

struct ClientItemResult {
  std::int64_t index = 0;
  Status status;   // OK or why this item has no embedding
  ContentKey key;  // as the server reported it (client-derived if the call failed)
  // Non-null iff status.ok() and the rows came inline; owned by the result. embedding->grid is the
  // image's (t, h, w) patch grid as the server sent it (EncodedItem.grid_thw;
  // {0, 0, 0} from a server too old to send it).
  // With Delivery::kShm and a reply by reference, `embedding` is null and
  // `shm` holds the rows instead (shm->Copy() gives an owned Embedding).
  EmbeddingPtr embedding;
  std::shared_ptr<ShmLease> shm;
  // With Delivery::kCudaIpc and a reply by CUDA IPC: the imported rows
  // (`embedding` and `shm` are then null).
  std::shared_ptr<IpcLease> ipc;
  ItemSource source = ItemSource::kMiss;
  double queue_ms = 0, tower_ms = 0, total_ms = 0;  // server-side, see ItemResult
  std::string server_id;                            // which server answered
  // Videos: the sampled frames' timestamps, sample rate and seconds per
  // temporal grid step (EncodedItem fields 17-19); null for an image.
  std::shared_ptr<const VideoTiming> video;
};

struct EncodeResult {
  Status status;                        // see Errors above
  std::vector<ClientItemResult> items;  // by index
};

// One item of a Probe (proto ProbedItem): what an Encode of it would key and
// produce, from its headers (epd/worker/item_probe.h).
struct ClientProbeItem {
  std::int64_t index = 0;
  Status status;            // OK, or why the item cannot be probed ("item <i>: " + the server's message)
  ContentKey key;           // the server's content key (tenant-namespaced)
  ContentKey route_key;     // the unsalted key for "x-epd-route"; equals KeyFor(item)
  GridTHW grid;             // (t, h, w); {0, 0, 0} for a caller_key alone
  std::int64_t tokens = 0;  // post-merge tokens
};

struct ProbeResult {
  Status status;                       // the call's, else the lowest-index failed item's, else OK
  std::vector<ClientProbeItem> items;  // by index
  std::string server_id;
};

class EncodeClient {
 public:
  // Creates the channel (connection is lazy: nothing is contacted here).
  // Each client has its own HTTP/2 connection; use several clients to spread
  // heavy traffic over several connections.
  // Errors: kInvalidArgument for an empty target, non-positive limits, or a
  // client certificate without its key (or the reverse).
  static StatusOr<std::unique_ptr<EncodeClient>> Connect(ClientOptions options);
  // Sends the queued releases (FlushReleases), then, with Delivery::kShm or
  // kCudaIpc, closes the lease session: the server releases every lease this
  // client still holds (its ShmLeases' rows may be overwritten, and its
  // IpcLeases' exports freed, from then on). Waits
  // for the server's answer at most `timeout`.
  ~EncodeClient();
  EncodeClient(const EncodeClient&) = delete;
  EncodeClient& operator=(const EncodeClient&) = delete;

  StatusOr<ServerInfo> Health();
  StatusOr<ServerStats> Stats();

  // Encodes `items`; see the header comment. No items: kInvalidArgument,
  // nothing sent. With Delivery::kShm or kCudaIpc, the first call opens the client's
  // lease session (one Session stream; an extra round trip, once) and every
  // call names it in the "x-epd-session" header. When the server refuses a
  // session (no arena, its --shm-max-sessions cap, a server older than the
  // Session RPC) calls go without one, their leases ending by release or
  // expiry only, and the next call tries again after a second. `request_id` empty = a fresh
  // random id (per-key calls get "<id>/<n>"). With route_by_key, the first
  // call fetches Health once to learn the key inputs (an error there fails
  // every item with it).
  EncodeResult Encode(std::vector<ClientItem> items, const std::string& request_id = "");

  // Sends the releases of destroyed ShmLeases still queued (one Release
  // call; none when the queue is empty). The server's refusals
  // (kFailedPrecondition, e.g. leases that expired meanwhile) are returned
  // but change nothing.
  Status FlushReleases();

  // The content key the server will use for `item`, from Health's inputs.
  StatusOr<ContentKey> KeyFor(const ClientItem& item);

  // The Probe RPC: each item's key, route key, grid and tokens, read by the
  // server from the headers without decoding (docs/SERVER.md, "Probe").
  // One call, unrouted (any server answers the same), under the client's
  // credentials; no items: kInvalidArgument, nothing sent. A call that fails
  // as a whole fails each item with its status. Blocks up to `timeout`.
  ProbeResult Probe(const std::vector<ClientItem>& items);

 private:
  struct Impl;
  explicit EncodeClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// gRPC's name for `code` ("INVALID_ARGUMENT", ...), including codes that
// StatusCodeName has no name for (e.g. 12 -> "UNIMPLEMENTED").
std::string GrpcStatusName(StatusCode code);

}  // namespace epd
