// Lease sessions (shm_session.h): the registry and the Session RPC's reactor.
#include "shm_session.h"

#include <sys/random.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <system_error>
#include <utility>
#include <vector>

#include "epd/core/mutex.h"
#include "proto_convert.h"

namespace epd::internal {
namespace {

constexpr std::size_t kIdBytes = 16;  // 128 bits

StatusOr<std::string> RandomId() {
  unsigned char bytes[kIdBytes];
  // Blocks only until the kernel's pool is first seeded (early boot).
  std::size_t got = 0;
  while (got < kIdBytes) {
    const ssize_t n = getrandom(bytes + got, kIdBytes - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status(StatusCode::kUnavailable,
                    std::string("getrandom for a session id failed: ") + std::generic_category().message(errno));
    }
    got += static_cast<std::size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id;
  id.reserve(2 * kIdBytes);
  for (unsigned char b : bytes) {
    id += kHex[b >> 4];
    id += kHex[b & 15];
  }
  return id;
}

}  // namespace

ShmSessions::ShmSessions(ShmArena* arena, IpcLeases* ipc, std::int64_t max_sessions)
    : arena_(arena), ipc_(ipc), max_sessions_(max_sessions) {}

std::size_t ShmSessions::ReleaseOwners(const LeaseOwners& owners) {
  std::size_t n = 0;
  if (arena_ != nullptr) n += arena_->ReleaseOwner(owners.shm);
  if (ipc_ != nullptr) n += ipc_->ReleaseOwner(owners.ipc);
  return n;
}

StatusOr<std::string> ShmSessions::Open(std::shared_ptr<Stream> stream) {
  StatusOr<std::string> id = RandomId();
  if (!id.ok()) return id.status();
  MutexLock lock(mu_);
  if (closed_) return Status(StatusCode::kUnavailable, "the server is shutting down");
  if (static_cast<std::int64_t>(open_.size()) >= max_sessions_) {
    ++refused_;
    return ResourceExhausted(std::to_string(open_.size()) + " lease sessions are open, this server's cap (" +
                             std::to_string(max_sessions_) +
                             ", --shm-max-sessions); each shared-memory client holds one: close idle clients, or "
                             "raise the cap");
  }
  // 128 random bits: a collision is not a practical concern, but costs
  // nothing to rule out.
  if (open_.contains(*id)) return Status(StatusCode::kUnavailable, "session id collision; retry");
  LeaseOwners owners;
  if (arena_ != nullptr) owners.shm = arena_->OpenOwner();
  if (ipc_ != nullptr) owners.ipc = ipc_->OpenOwner();
  open_.emplace(*id, Entry{owners, std::move(stream)});
  ++opened_;
  return id;
}

std::size_t ShmSessions::Close(const std::string& id) {
  std::shared_ptr<Stream> stream;  // dropped after the lock
  MutexLock lock(mu_);
  auto it = open_.find(id);
  if (it == open_.end()) return 0;
  stream = std::move(it->second.stream);
  const LeaseOwners owners = it->second.owners;
  open_.erase(it);
  return ReleaseOwners(owners);
}

StatusOr<LeaseOwners> ShmSessions::OwnerFor(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) {
  const auto it = metadata.find(kSessionHeader);
  if (it == metadata.end()) return LeaseOwners{};
  std::string id(it->second.data(), it->second.size());
  bool hex = id.size() == 2 * kIdBytes;
  for (char& c : id) {
    hex = hex && std::isxdigit(static_cast<unsigned char>(c));
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  if (!hex) {
    return InvalidArgument(std::string("the ") + kSessionHeader +
                           " metadata must be the 32 hex digits of a session id from the Session RPC; got " +
                           std::to_string(id.size()) + " characters");
  }
  MutexLock lock(mu_);
  auto e = open_.find(id);
  if (e == open_.end()) {
    ++unknown_;
    return LeaseOwners{};
  }
  return e->second.owners;
}

void ShmSessions::EndAll(const Status& why) {
  std::vector<std::shared_ptr<Stream>> streams;
  {
    MutexLock lock(mu_);
    closed_ = true;
    for (auto& [id, entry] : open_) {
      ReleaseOwners(entry.owners);
      streams.push_back(std::move(entry.stream));
    }
    open_.clear();
  }
  for (const std::shared_ptr<Stream>& s : streams) s->EndFromServer(why);
}

void ShmSessions::AddStats(ShmStats* s) {
  MutexLock lock(mu_);
  s->sessions = static_cast<std::int64_t>(open_.size());
  s->sessions_opened = opened_;
  s->sessions_refused = refused_;
  s->session_unknown = unknown_;
}

namespace {

// One Session call. It keeps itself alive (self_) until OnDone, because
// ShmSessions may hold it past the call's end and EndAll may reach it from
// another thread; every Start*/Finish happens under mu_ and only while
// finished_ is false, so none comes after Finish.
class SessionReactor final : public grpc::ServerBidiReactor<v1::SessionMessage, v1::SessionEvent>,
                             public ShmSessions::Stream {
 public:
  explicit SessionReactor(ShmSessions* sessions) : sessions_(sessions) {}

  void Begin(std::shared_ptr<SessionReactor> self, Status admission) {
    self_ = std::move(self);
    std::string id;
    if (admission.ok()) {
      StatusOr<std::string> opened = sessions_->Open(self_);
      if (opened.ok()) {
        id = std::move(*opened);
      } else {
        admission = opened.status();
      }
    }
    MutexLock lock(mu_);
    if (finished_) return;  // EndAll ended it between Open and here
    if (!admission.ok()) {
      finished_ = true;
      Finish(ToGrpc(admission));
      return;
    }
    id_ = std::move(id);
    event_.set_session_id(id_);
    event_.set_lease_ms(sessions_->lease().count());
    StartWrite(&event_);
    StartRead(&in_);
  }

  void EndFromServer(const Status& why) override { End(why); }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client half-closed, or the stream broke
      End(Status::Ok());
      return;
    }
    MutexLock lock(mu_);
    if (!finished_) StartRead(&in_);  // messages carry nothing yet
  }

  void OnWriteDone(bool) override {}

  void OnCancel() override { End(Cancelled("the session's stream was cancelled (the client went away)")); }

  void OnDone() override {
    // The last reference may be this one; nothing of *this is touched after.
    std::shared_ptr<SessionReactor> keep = std::move(self_);
  }

 private:
  // Closes the session (its leases are released) and finishes the call,
  // once, whichever sign of the end comes first.
  void End(const Status& why) {
    std::string id;
    {
      MutexLock lock(mu_);
      if (finished_) return;
      finished_ = true;
      id = id_;
    }
    // Not under mu_: Close may drop ShmSessions' reference to this stream.
    if (!id.empty()) sessions_->Close(id);
    MutexLock lock(mu_);
    Finish(ToGrpc(why));
  }

  ShmSessions* const sessions_;
  std::shared_ptr<SessionReactor> self_;
  Mutex mu_;
  bool finished_ EPD_GUARDED_BY(mu_) = false;  // Finish was called or is about to be
  std::string id_ EPD_GUARDED_BY(mu_);
  v1::SessionEvent event_;
  v1::SessionMessage in_;
};

}  // namespace

grpc::ServerBidiReactor<v1::SessionMessage, v1::SessionEvent>* StartSessionReactor(ShmSessions* sessions,
                                                                                   Status admission) {
  auto reactor = std::make_shared<SessionReactor>(sessions);
  SessionReactor* raw = reactor.get();
  raw->Begin(std::move(reactor), std::move(admission));
  return raw;
}

}  // namespace epd::internal
