// epd/server/server.h: the encode stage as a gRPC service (proto/epd/v1/encoder.proto).
//
// EncodeServer puts a network front on one EncodeWorker: it owns a WorkerLoop
// (one thread that owns the cache, the scheduler and the tower), a gRPC
// server whose Encode calls only validate, enqueue and stream, and an
// optional Prometheus endpoint. Where a plain WorkerLoop hands results to
// in-process callbacks, the server streams each item to the client as soon as
// it is ready and maps every epd::Status onto the gRPC code of the same
// number (epd/core/status.h).
//
// A call's life (gRPC's callback API: a call waiting for the worker or for
// its client holds no thread):
//   1. The server checks the bearer token when one is set (UNAUTHENTICATED),
//      validates the request's form (INVALID_ARGUMENT naming the item: no
//      items, more than max_items_per_request, an item with neither image
//      nor caller key; or a request id that is not printable ASCII or uses
//      the prefix reserved for ids the server assigns) and submits it to the
//      WorkerLoop, which hashes the keys on gRPC's receiving thread. Item rules
//      (expected_tokens, a bad image) are the worker's: such an item fails
//      alone (epd/worker/encode_worker.h).
//   2. The worker thread's callbacks push the ItemResult (a shared pointer
//      to the cached embedding, no copy) onto the call's queue, and one
//      write at a time goes out: a reference reply (shared memory, CUDA IPC)
//      is built on the worker thread, an inline one (the rows copied into
//      the EncodedItem) on a small pool, never the worker. A slow client
//      therefore delays only its own writes.
//   3. The call ends OK, or with the request's status (ALREADY_EXISTS,
//      RESOURCE_EXHAUSTED, UNAVAILABLE, INVALID_ARGUMENT for more misses than
//      the worker's max_pending_items), or with the lowest-index failed
//      item's status after streaming the rest (INVALID_ARGUMENT for a bad
//      image, INTERNAL for a tower failure; the message is prefixed
//      "item <i>: " here, the one place it is added). A streamed
//      EncodedItem carries its index and the worker's message as it is.
//   Deadline or client cancellation: the server cancels the request in the
//   worker (queued items no other request waits on are dropped) and ends the
//   call with DEADLINE_EXCEEDED or CANCELLED. Cancellation by the client is
//   noticed when gRPC reports it (no polling), and so is a deadline.
//
// Backpressure: results delivered to calls but not yet sent hold their
// embeddings alive. They are charged to the call's tenant, and when the
// tenants' bytes, each counted up to its share (max_buffered_bytes_per_tenant),
// exceed max_buffered_bytes the worker's sink_full() holds, so it starts no
// new tower batch (cache hits are still served) until writers drain below the
// limit. One tenant whose client stops reading therefore never stops the
// tower for the others (its share is under the limit): its results wait on
// its own calls (it is throttled), and write_timeout cancels a call whose
// client accepts nothing. Memory a reply handed to gRPC holds (its message,
// twice) is bounded per connection and in total (max_reply_bytes_per_connection,
// max_reply_bytes): a reply past either ends its call with RESOURCE_EXHAUSTED
// naming the budget. docs/SERVER.md, "Clients that stop reading".
//
// Shutdown(grace): Health and grpc.health.v1 report not serving; new calls
// are refused; calls in flight keep running until `grace` has passed, then
// are cancelled; the worker thread stops; the metrics endpoint closes. It
// returns within about grace + 0.3 s whatever clients do (open channels and
// streams included), plus the tower batch running at the time, if any.
//
// Every call that ends with an error, on any service and including refusals
// before a handler runs (a message that does not parse), is counted in ServerStats::rpc_errors and passed to
// ServerOptions::log (rate-limited). Besides epd.v1.Encoder the server speaks
// grpc.health.v1.Health and server reflection (docs/SERVER.md). Security is
// opt-in: TLS or mutual TLS, and a bearer token (ServerOptions below).
//
// Thread safety: thread-safe. Ownership: the server owns the worker, its
// tower and caches.
//
// Example:
//   epd::ServerOptions so;
//   so.address = "127.0.0.1:0";
//   auto server = epd::EncodeServer::Start(so, worker_options, std::move(tower));
//   if (!server.ok()) return server.status();
//   std::printf("listening on %d\n", (*server)->port());
//   (*server)->Shutdown(std::chrono::seconds(10));
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "epd/core/status.h"
#include "epd/core/vision_tower.h"
#include "epd/gpu/device.h"
#include "epd/rpc/server_stats.h"
#include "epd/worker/encode_worker.h"

namespace epd {

class ServerFrontDoor;  // epd/server/front_door.h

// One line of a tokens file (--tokens-file): a bearer token, the tenant it
// names, and whether it is an operator's (global Stats; docs/SECURITY.md).
struct TenantToken {
  std::string token;   // non-empty
  std::string tenant;  // 1..128 bytes of printable ASCII, no spaces
  bool is_operator = false;
};

// Whether tenants share one key space (kNone) or each has its own (kSalted,
// epd/media/tenant_key.h). kAuto = kSalted as soon as tenant_tokens name more
// than one tenant, else kNone. docs/SECURITY.md.
enum class TenantIsolation : std::uint8_t { kAuto = 0, kNone = 1, kSalted = 2 };

// Who a call's caller is, decided once per call from its credential
// (src/server/tenants.h has the rule; docs/SECURITY.md).
struct CallerIdentity {
  std::string tenant;                         // never empty ("default" when nothing names one)
  bool named_by_credential = false;           // a token or a client certificate named it
  bool is_operator = false;                   // may read global Stats and the metrics page
  std::string share;                          // the fair order's share (EncodeRequest::tenant)
  std::optional<KeyNamespace> key_namespace;  // set under isolation salted
};

struct ServerOptions {
  // "host:port" to listen on. Port 0 picks a free port (see port()). Or
  // "unix:/path" for a Unix domain socket (port() is then 0).
  std::string address = "0.0.0.0:50051";
  // More addresses served alongside `address`, same forms (e.g. a Unix
  // socket for co-located clients next to TCP for the rest). A Unix socket's
  // path must not exist yet; it is the caller's to remove after Shutdown.
  std::vector<std::string> extra_addresses{};
  // Shared-memory delivery (docs/SHM.md): the size of the memfd arena that
  // holds rows sent by reference, bytes; 0 = off (clients asking for it get
  // inline bytes). The memory is committed at Start. Bytes under lease never
  // exceed it: past it, items go inline and are counted (ShmStats::fallbacks).
  std::int64_t shm_arena_bytes = 0;
  // How long a reference stays valid without a Release; then its span may be
  // overwritten. A crashed client's leases end this way, or sooner when it
  // held them under a lease session.
  std::chrono::milliseconds shm_lease{5000};
  // CUDA IPC delivery (docs/SHM.md, "CUDA IPC"): the Device whose memory
  // holds the GPU tier's L1 rows (the one MakeEmbeddingTierHooks was given;
  // a FakeDevice in tests). Null = off (clients asking for it get shared
  // memory or inline bytes). Not owned; it must outlive the server.
  Device* ipc_device = nullptr;
  // Bound on the bytes of live CUDA IPC exports (each a private device copy
  // of an item's rows, outside the tier's capacity), bytes; past it items
  // fall back (IpcStats::fallbacks). 0 = off even with ipc_device.
  std::int64_t ipc_export_bytes = 0;
  // Lease time of a CUDA IPC reference; 0 = shm_lease.
  std::chrono::milliseconds ipc_lease{0};
  // Most lease sessions (the Session RPC, docs/SHM.md "Crashed clients")
  // open at once; one more is refused with RESOURCE_EXHAUSTED naming this
  // cap. A session holds no RPC thread (callback API), only a stream.
  std::int64_t shm_max_sessions = 1024;
  // Reported in every EncodedItem and in Health/Stats; empty = "<host>:<port>"
  // with the machine's host name and the bound port.
  std::string server_id;
  // Prometheus text exposition at http://<metrics_address>:<port>/metrics
  // (epd::HttpEndpoint: idle connections hold no thread). -1 = off, 0 = a
  // free port (see metrics_port()). Empty metrics_address = the host of
  // `address` (127.0.0.1 for a Unix socket). With auth_token set, a scrape
  // must carry "Authorization: Bearer <token>" too (401 otherwise).
  int metrics_port = -1;
  std::string metrics_address{};
  // Most items one request may carry (INVALID_ARGUMENT beyond it).
  std::int64_t max_items_per_request = 256;
  // Largest request message accepted, bytes; larger ones get
  // RESOURCE_EXHAUSTED (counted and logged). gRPC's own limit is set to twice
  // this: messages beyond that are refused by gRPC before the server sees
  // them, so only those go uncounted. Default 64 MiB.
  std::int64_t max_request_bytes = std::int64_t{64} << 20;
  // Request bytes admitted into the server and not yet finished (the
  // in-flight request budget). A call whose message would pass it waits up
  // to admission_wait for room, then gets RESOURCE_EXHAUSTED naming the
  // budget (counted and logged). It also sizes gRPC's ResourceQuota, which
  // bounds the transport's own buffers. Must be >= max_request_bytes.
  // Default 1 GiB. See docs/SERVER.md, "Memory".
  std::int64_t max_inflight_request_bytes = std::int64_t{1} << 30;
  std::chrono::milliseconds admission_wait{100};
  // Runs (on a gRPC or pool thread) when the admitted request bytes fall
  // back to 0 after a burst, one that held at least
  // max_inflight_request_bytes / 16 in flight at once (a steady stream of
  // small calls never does), and likewise when the reply bytes held for
  // clients fall back to 0 after a burst of max_reply_bytes / 16, e.g. to
  // return freed heap to the OS (the CLI calls malloc_trim). Null = nothing.
  std::function<void()> on_requests_drained{};
  // The fair share a call is charged to under ScheduleOrder::kFair (see
  // WorkerOptions::order): this metadata key's value when the client sends
  // it ("tenant:<value>"), else the client's address without its port.
  // Empty = by address only (use that when clients are not trusted to name
  // themselves: a client could otherwise claim a share per made-up name).
  std::string tenant_metadata = "x-epd-tenant";
  // Results waiting for slow clients, bytes, above which the worker starts no
  // new tower batch (see Backpressure above). Default 256 MiB.
  std::int64_t max_buffered_bytes = std::int64_t{256} << 20;
  // One tenant's share of max_buffered_bytes: its buffered bytes past this
  // do not count towards stopping the tower. 0 = max_buffered_bytes / 4.
  // A share above max_buffered_bytes lets one tenant stop the tower again.
  std::int64_t max_buffered_bytes_per_tenant = 0;
  // Memory held for replies handed to gRPC and not yet sent, bytes: in
  // total, and per connection (a gRPC peer, i.e. one TCP connection; all
  // Unix-socket clients share one). A reply that would pass either ends its
  // call with RESOURCE_EXHAUSTED naming the budget, unless nothing else is
  // held there (so each budget holds at most itself plus one reply). When
  // the held bytes fall back to 0 after a burst of max_reply_bytes / 16,
  // on_requests_drained runs too.
  std::int64_t max_reply_bytes = std::int64_t{1} << 30;
  std::int64_t max_reply_bytes_per_connection = std::int64_t{256} << 20;
  // An Encode call whose client accepts none of a reply for this long (a
  // write handed to gRPC that does not complete: HTTP/2 flow control, the
  // client not reading) is cancelled, counted (ServerStats::write_timeouts)
  // and logged. Progress is a completed message: a client must take one
  // reply (up to a few MB) in this time. 0 = never.
  std::chrono::milliseconds write_timeout{30000};
  // HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS: calls one connection may have
  // open at once (a client opening more is refused by gRPC with
  // REFUSED_STREAM; gRPC clients queue them instead). 0 = gRPC's default
  // (no limit).
  int max_concurrent_streams = 256;
  // Most handler threads of the sync methods (Health, Stats, Release); a
  // call of theirs arriving when all are busy is refused with
  // RESOURCE_EXHAUSTED by gRPC. Encode and Session calls hold none: the
  // request budget and gRPC's memory quota bound them.
  int max_rpc_threads = 256;
  // HTTP/2 keepalive from the server: on a connection with a call open (a
  // lease session, a long Encode), the server pings the client every
  // `keepalive` and closes the connection when an answer does not come
  // within `keepalive_timeout`, ending its calls and sessions (whose leases
  // are then released). It is how a client whose host vanished (power loss,
  // a partition: no FIN ever arrives) is noticed; gRPC's own default is a
  // first ping after two hours. Connections without calls are not pinged.
  // 0 = gRPC's default. Detection takes at most about keepalive +
  // keepalive_timeout. gRPC clients answer pings by themselves, and so does
  // nginx (which then answers for its clients: behind nginx the server
  // notices a vanished nginx, not a vanished client). nginx reads pings only
  // as fast as its client reads the reply, so a client behind nginx that
  // stops reading a reply the server has ready for longer than keepalive +
  // keepalive_timeout loses the call (docs/SHM.md, "Detection time").
  std::chrono::milliseconds keepalive{60000};
  std::chrono::milliseconds keepalive_timeout{20000};
  // TLS, as PEM text (not paths). Both empty = plaintext. With a client CA
  // too, mutual TLS: a client must present a certificate that CA signed, or
  // its connection is refused during the handshake.
  std::string tls_cert_pem{};       // the server's certificate (chain)
  std::string tls_key_pem{};        // its private key, unencrypted
  std::string tls_client_ca_pem{};  // empty = clients are not asked for one
  // Non-empty: every Encode, Health and Stats call must carry the metadata
  // "authorization: Bearer <auth_token>", else UNAUTHENTICATED (compared in
  // constant time). gRPC's standard health and reflection services do not
  // ask for it. Send it only over TLS or a private network.
  std::string auth_token{};
  // Tenants (docs/SECURITY.md, "Who the tenant is"). Non-empty: every call
  // must carry one of these bearer tokens (auth_token, if also set, is one
  // more: tenant "default", an operator), and the token names the caller's
  // tenant; a tenant header it sends too is ignored. Without tokens, a
  // mutual-TLS client certificate names the tenant by its subject field
  // tls_tenant_field ("CN", another RDN such as "O" or "OU", or "subject"
  // for the whole subject as gRPC's AuthContext prints it). Only where no
  // credential names a tenant and trust_tenant_header is set does the
  // tenant_metadata header name it; else the caller is tenant "default".
  std::vector<TenantToken> tenant_tokens{};
  std::string tls_tenant_field = "CN";
  bool trust_tenant_header = false;
  // Key namespaces per tenant; kSalted needs tenant_secret (>= 16 bytes,
  // the same on every server of a cluster, e.g. --tenant-secret-file).
  TenantIsolation tenant_isolation = TenantIsolation::kAuto;
  std::string tenant_secret{};
  // Tenants whose items marked public go to the shared "public" namespace
  // (readable by every tenant listed); "*" = every tenant. Others' public
  // marks are ignored.
  std::vector<std::string> public_readers{};
  // Per-tenant metrics: at most this many tenant labels on the metrics page;
  // later tenants are folded into the label "other". >= 1.
  int max_tenant_labels = 32;
  // The load channel (docs/SECURITY.md): with salted keys a tenant never
  // hits or joins another's entry, but its miss still waits while others'
  // encodes hold the tower, so a miss's time says whether someone else is
  // encoding. Non-zero: an item that missed (ItemSource::kMiss, succeeded)
  // is not written before this long after its call arrived, so a miss whose
  // encode finishes within the floor takes the same time whatever the load;
  // past the floor it goes out at once (the leak then is its tail). Items
  // queued behind it in the call's stream wait with it; a front end's one
  // reply (ServerFrontDoor::Encode, the HTTP front) waits when any of its
  // items missed, holding its thread. Hits, in-flight
  // joins (salted, a caller joins only its own namespace's encodes) and
  // failed items are not held. Costs each miss up to the floor in latency.
  // 0 = off; must be >= 0. Set it above the misses' p99 under load.
  std::chrono::milliseconds miss_reply_floor{0};
  // Receives one line per call that ended with an error (any service, refusals
  // before a handler ran included: a request that does not parse), at most
  // 10 lines a second; the next line let through
  // says how many were dropped. Called on gRPC threads; must be thread-safe.
  // Null = no log (the calls are still counted in ServerStats::rpc_errors).
  std::function<void(const std::string&)> log{};

  // OK, or kInvalidArgument naming the first bad option: an address that is
  // neither host:port nor unix:/path; a negative shm_arena_bytes,
  // ipc_export_bytes or ipc_lease; a non-positive shm_lease or
  // shm_max_sessions; max_items_per_request <= 0; max_request_bytes outside
  // (0, 2047 MiB]; max_inflight_request_bytes < max_request_bytes; negative
  // admission_wait, keepalive, keepalive_timeout, miss_reply_floor,
  // write_timeout, max_concurrent_streams or max_buffered_bytes_per_tenant;
  // non-positive max_buffered_bytes, max_reply_bytes or
  // max_reply_bytes_per_connection; max_rpc_threads < 2. EncodeServer::Start
  // runs it first. O(number of addresses).
  Status Validate() const;
};

class EncodeServer {
 public:
  // Creates the worker from `worker_options` and `tower` (the server installs
  // its own sink_full; one already set is also honoured), starts the worker
  // thread, the gRPC server and, when asked, the metrics endpoint.
  // Errors: EncodeWorker::Create's (kInvalidArgument); kInvalidArgument for
  // bad ServerOptions (ServerOptions::Validate) or a null tower;
  // kUnavailable when the address or metrics port cannot be bound.
  static StatusOr<std::unique_ptr<EncodeServer>> Start(ServerOptions options, WorkerOptions worker_options,
                                                       std::unique_ptr<VisionTower> tower);
  ~EncodeServer();  // Shutdown(0) when it has not run
  EncodeServer(const EncodeServer&) = delete;
  EncodeServer& operator=(const EncodeServer&) = delete;

  int port() const;          // the bound gRPC port
  int metrics_port() const;  // the bound metrics port, -1 when off
  const std::string& server_id() const;
  ServerStats Stats() const;
  // The way in for another front end over this server's worker, budget,
  // token and metrics (epd/server/front_door.h, which defines it).
  ServerFrontDoor front_door();

  // See the header comment. Idempotent; returns when everything has stopped.
  void Shutdown(std::chrono::milliseconds grace);

  // Opaque: defined in src/server/server_impl.h, and named here in public
  // only so that its per-call classes can reach it.
  struct Impl;

 private:
  explicit EncodeServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace epd
