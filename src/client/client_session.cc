// ClientSession (client_session.h).
#include "client_session.h"

#include <utility>

#include "proto_convert.h"

namespace epd::internal {

StatusOr<std::unique_ptr<ClientSession>> ClientSession::Open(v1::Encoder::Stub& stub, const std::string& authorization,
                                                             std::chrono::milliseconds timeout) {
  std::unique_ptr<ClientSession> s(new ClientSession());
  s->timeout_ = timeout;
  // No deadline: the stream lives as long as the client.
  if (!authorization.empty()) s->ctx_.AddMetadata("authorization", authorization);
  s->stream_ = stub.Session(&s->ctx_);
  s->reader_ = std::thread([raw = s.get()] { raw->ReadUntilEnd(); });
  MutexLock lock(s->mu_);
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (!s->got_event_ && !s->ended_ && s->cv_.WaitUntil(s->mu_, until) == std::cv_status::no_timeout) {
  }
  if (!s->got_event_ && !s->ended_) {
    lock.Unlock();
    s->ctx_.TryCancel();  // the destructor joins the reader
    return Status(StatusCode::kDeadlineExceeded,
                  "the server did not name a lease session within " + std::to_string(timeout.count()) + " ms");
  }
  if (!s->got_event_) {
    const grpc::Status end = s->end_;
    lock.Unlock();
    Status why = FromGrpc(end);
    if (why.ok()) why = Internal("the server ended the lease session without naming it");
    return why;
  }
  lock.Unlock();
  return s;
}

void ClientSession::ReadUntilEnd() {
  v1::SessionEvent event;
  bool first = true;
  while (stream_->Read(&event)) {
    if (!first) continue;  // no later event is defined yet
    first = false;
    MutexLock lock(mu_);
    id_ = event.session_id();
    got_event_ = !id_.empty();
    cv_.NotifyAll();
  }
  grpc::Status end = stream_->Finish();
  MutexLock lock(mu_);
  ended_ = true;
  end_ = std::move(end);
  cv_.NotifyAll();
}

bool ClientSession::live() {
  MutexLock lock(mu_);
  return got_event_ && !ended_;
}

ClientSession::~ClientSession() {
  // Half-close: the server ends the session (releasing its leases) and
  // finishes the call, which ends the reader's loop.
  bool ended = false;
  {
    MutexLock lock(mu_);
    ended = ended_;
  }
  if (!ended) stream_->WritesDone();
  {
    MutexLock lock(mu_);
    const auto until = std::chrono::steady_clock::now() + timeout_;
    while (!ended_ && cv_.WaitUntil(mu_, until) == std::cv_status::no_timeout) {
    }
    if (!ended_) {
      lock.Unlock();
      ctx_.TryCancel();  // a server that does not answer: cancel (it ends the session too)
    }
  }
  if (reader_.joinable()) reader_.join();
}

}  // namespace epd::internal
