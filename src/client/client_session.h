// src/client/client_session.h (internal to epd::client): the client's end of
// a lease session (the Session RPC, docs/SHM.md "Crashed clients").
//
// Open starts a Session stream and waits for the server's SessionEvent
// naming it; a thread then reads the stream until it ends, so live() turns
// false as soon as the server ends it (server shutdown). Destruction
// half-closes the stream, which makes the server release every lease still
// under the session, and waits for the server to finish the call (at most
// `timeout`, then it cancels, which ends the session just the same).
//
// Thread safety: thread-safe.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "epd/core/mutex.h"
#include "epd/core/status.h"
#include "epd/v1/encoder.grpc.pb.h"

namespace epd::internal {

class ClientSession {
 public:
  // `authorization`: the bearer header's value, empty for none. Waits at most
  // `timeout` for the server's first event. Errors: the server's status
  // (FAILED_PRECONDITION without an arena, RESOURCE_EXHAUSTED at its cap,
  // UNIMPLEMENTED from a server that predates sessions, UNAVAILABLE...), or
  // DEADLINE_EXCEEDED when no event came in time.
  static StatusOr<std::unique_ptr<ClientSession>> Open(v1::Encoder::Stub& stub, const std::string& authorization,
                                                       std::chrono::milliseconds timeout);
  ~ClientSession();
  ClientSession(const ClientSession&) = delete;
  ClientSession& operator=(const ClientSession&) = delete;

  // The session's id, 32 hex digits, for the "x-epd-session" header.
  const std::string& id() const { return id_; }
  // False once the stream has ended (the server ended it, or it broke).
  bool live();

 private:
  ClientSession() = default;
  void ReadUntilEnd();

  std::chrono::milliseconds timeout_{0};
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SessionMessage, v1::SessionEvent>> stream_;
  std::thread reader_;
  std::string id_;  // set before Open returns
  Mutex mu_;
  CondVar cv_;
  bool got_event_ EPD_GUARDED_BY(mu_) = false;
  bool ended_ EPD_GUARDED_BY(mu_) = false;  // Read returned false
  grpc::Status end_ EPD_GUARDED_BY(mu_);    // Finish's status, once ended_
};

}  // namespace epd::internal
