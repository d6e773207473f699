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
  std::unique_lock<std::mutex> lock(s->mu_);
  if (!s->cv_.wait_for(lock, timeout, [&] { return s->got_event_ || s->ended_; })) {
    lock.unlock();
    s->ctx_.TryCancel();  // the destructor joins the reader
    return Status(StatusCode::kDeadlineExceeded,
                  "the server did not name a lease session within " + std::to_string(timeout.count()) + " ms");
  }
  if (!s->got_event_) {
    const grpc::Status end = s->end_;
    lock.unlock();
    Status why = FromGrpc(end);
    if (why.ok()) why = Internal("the server ended the lease session without naming it");
    return why;
  }
  lock.unlock();
  return s;
}

void ClientSession::ReadUntilEnd() {
  v1::SessionEvent event;
  bool first = true;
  while (stream_->Read(&event)) {
    if (!first) continue;  // no later event is defined yet
    first = false;
    std::lock_guard<std::mutex> lock(mu_);
    id_ = event.session_id();
    got_event_ = !id_.empty();
    cv_.notify_all();
  }
  grpc::Status end = stream_->Finish();
  std::lock_guard<std::mutex> lock(mu_);
  ended_ = true;
  end_ = std::move(end);
  cv_.notify_all();
}

bool ClientSession::live() {
  std::lock_guard<std::mutex> lock(mu_);
  return got_event_ && !ended_;
}

ClientSession::~ClientSession() {
  // Half-close: the server ends the session (releasing its leases) and
  // finishes the call, which ends the reader's loop.
  bool ended = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ended = ended_;
  }
  if (!ended) stream_->WritesDone();
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout_, [&] { return ended_; })) {
      lock.unlock();
      ctx_.TryCancel();  // a server that does not answer: cancel (it ends the session too)
    }
  }
  if (reader_.joinable()) reader_.join();
}

}  // namespace epd::internal
