// src/server/shm_session.h (internal to epd::server): lease sessions, the
// server side of the Session RPC (docs/SHM.md, "Crashed clients").
//
// A client that holds shared-memory or CUDA IPC leases keeps one Session
// stream open. The server names the session with 128 random bits and
// records, under the session, every lease made by an Encode call that sends
// that name in the "x-epd-session" metadata header: a session is one owner
// in each lease store the server has (ShmArena and IpcLeases owners, both
// LeaseBook owners underneath, lease_book.h). When the stream ends,
// for whatever reason (the client half-closes or cancels it, its process
// dies and the kernel closes the socket, the server shuts down), every lease
// still recorded under the session is released at once. Leases outside any
// session end by release or expiry only, as before; a session never
// lengthens a lease, so a client that hangs while connected still loses its
// leases at their deadlines.
//
// A call naming a session that is not open here (ended, opened on another
// server behind a proxy, or made up) is served all the same, its leases
// outside any session, and counted (ShmStats::session_unknown). Refusing it
// would fail a client's calls in the window between its session ending and
// it noticing, and behind a proxy that spreads a client's calls over several
// servers; the reply's ShmRef.in_session and CudaIpcRef.in_session tell the
// client which leases are covered.
//
// Why the callback API: a sync server holds a thread per open call, and a
// session stays open for its client's lifetime. A ServerBidiReactor holds no
// thread while it waits; the number of sessions is capped by
// ServerOptions::shm_max_sessions.
//
// Thread safety: ShmSessions is thread-safe (one mutex, taken before the
// arena's and the CUDA IPC store's). The reactor's operations may come from gRPC's callback threads
// and from EndAll concurrently; it serialises them with its own mutex.
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/server_callback.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>

#include "epd/core/mutex.h"
#include "epd/core/status.h"
#include "epd/rpc/server_stats.h"
#include "epd/v1/encoder.pb.h"
#include "ipc_leases.h"
#include "proto_convert.h"  // kSessionHeader
#include "shm_arena.h"

namespace epd::internal {

// A session's owner tag in each lease store; 0 where the server has no such
// store, or where a call names no open session.
struct LeaseOwners {
  std::uint64_t shm = 0;  // ShmArena owner
  std::uint64_t ipc = 0;  // IpcLeases owner
};

class ShmSessions {
 public:
  // One session's stream, as the server can end it (the reactor).
  class Stream {
   public:
    virtual ~Stream() = default;
    // Ends the stream with `why` unless it has ended already. EndAll calls
    // it with no lock of ShmSessions held, so it may call back (Close).
    virtual void EndFromServer(const Status& why) = 0;
  };

  // `arena` and `ipc` (either may be null, not both) must outlive this
  // object. REQUIRES: max_sessions > 0.
  ShmSessions(ShmArena* arena, IpcLeases* ipc, std::int64_t max_sessions);

  // Opens a session for `stream` and returns its id: 32 lowercase hex digits
  // of 128 bits from getrandom(2), the kernel's CSPRNG. `stream` is kept
  // until Close (or EndAll). Errors: kResourceExhausted at the cap (the
  // message names it and its flag), counted in sessions_refused;
  // kUnavailable after EndAll, or when getrandom fails.
  StatusOr<std::string> Open(std::shared_ptr<Stream> stream);

  // Ends session `id`: releases every lease of either kind still under it
  // (counted in ShmStats::session_reclaimed and IpcStats::session_reclaimed;
  // a CUDA IPC export whose last lease it was is freed) and forgets it.
  // Returns how many leases it released; 0 for an id that is not open
  // (harmless to repeat).
  std::size_t Close(const std::string& id);

  // The owners of the session that `metadata`'s "x-epd-session" header
  // names: both 0 when there is no header, and both 0 (counted in
  // session_unknown) when the named session is not open. kInvalidArgument
  // when the header is not 32 hex digits (either case).
  StatusOr<LeaseOwners> OwnerFor(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata);

  // Server shutdown: refuses later Opens (kUnavailable), closes every open
  // session as Close does, then ends each one's stream with `why`.
  void EndAll(const Status& why);

  // Fills the session fields of `s` but session_reclaimed (the arena's).
  void AddStats(ShmStats* s);

  std::int64_t max_sessions() const { return max_sessions_; }
  // The lease time a SessionEvent announces: the arena's, or the CUDA IPC
  // lease's on a server without an arena.
  std::chrono::milliseconds lease() const { return arena_ != nullptr ? arena_->lease() : ipc_->lease(); }

 private:
  struct Entry {
    LeaseOwners owners;
    std::shared_ptr<Stream> stream;
  };
  // Releases the leases under `owners` in both stores; how many it ended.
  std::size_t ReleaseOwners(const LeaseOwners& owners);

  ShmArena* const arena_;
  IpcLeases* const ipc_;
  const std::int64_t max_sessions_;
  Mutex mu_;
  std::unordered_map<std::string, Entry> open_ EPD_GUARDED_BY(mu_);  // by id
  bool closed_ EPD_GUARDED_BY(mu_) = false;                          // EndAll ran
  std::uint64_t opened_ EPD_GUARDED_BY(mu_) = 0;
  std::uint64_t refused_ EPD_GUARDED_BY(mu_) = 0;
  std::uint64_t unknown_ EPD_GUARDED_BY(mu_) = 0;
};

// The Session RPC's reactor. When `admission` is not OK (no bearer token, no
// lease store, the server shutting down) the call ends with it at once; otherwise
// it opens a session in `sessions` (which may refuse it, see Open), sends the
// SessionEvent naming it, reads and ignores the client's messages, and
// closes the session when the stream ends. `sessions` may be null only when
// `admission` is not OK. The reactor deletes itself when gRPC is done with it.
grpc::ServerBidiReactor<v1::SessionMessage, v1::SessionEvent>* StartSessionReactor(ShmSessions* sessions,
                                                                                   Status admission);

}  // namespace epd::internal
