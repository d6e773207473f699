// See epd/server/front_door.h.
#include "epd/server/front_door.h"

#include <algorithm>
#include <chrono>
#include <future>
#include <memory>
#include <thread>

#include "request_id.h"
#include "server_impl.h"

namespace epd {
namespace {

RequestResult Refused(const std::string& id, Status why) {
  RequestResult r;
  r.id = id;
  r.status = std::move(why);
  return r;
}

// "ipv4:1.2.3.4" / "ipv6:[::1]", as gRPC spells a peer without its port.
std::string GrpcPeer(const std::string& ip) {
  return ip.find(':') == std::string::npos ? "ipv4:" + ip : "ipv6:[" + ip + "]";
}

}  // namespace

ServerFrontDoor EncodeServer::front_door() { return ServerFrontDoor(impl_.get()); }

Status ServerFrontDoor::TakeBudget(std::int64_t bytes) const {
  if (bytes <= 0) return Status::Ok();
  if (bytes > s_->budget->capacity()) {
    return ResourceExhausted("the request's media come to more than the in-flight request budget of " +
                             std::to_string(s_->budget->capacity()) + " bytes (--max-inflight-request-mb)");
  }
  Status granted = Status::Ok();
  // A deadline already passed: the grant runs inline, now, either way.
  s_->budget->Acquire(bytes, std::chrono::steady_clock::now(), [&granted](const Status& st) { granted = st; });
  return granted;
}

void ServerFrontDoor::ReleaseBudget(std::int64_t bytes) const {
  if (bytes > 0) s_->budget->Release(bytes);
}

RequestResult ServerFrontDoor::Encode(EncodeRequest request, std::int64_t bytes, const CallerIdentity& caller) const {
  EncodeServer::Impl& s = *s_;
  const auto arrived = std::chrono::steady_clock::now();
  request.id = internal::AutoRequestId(s.next_auto_id++);
  request.tenant = caller.share;
  request.key_namespace = caller.key_namespace;
  if (!s.serving.load()) return Refused(request.id, Status(StatusCode::kUnavailable, "the server is shutting down"));
  if (bytes > s.budget->capacity()) {
    return Refused(request.id,
                   ResourceExhausted("the request holds " + std::to_string(bytes) +
                                     " bytes of media; the in-flight request budget is " +
                                     std::to_string(s.budget->capacity()) + " bytes (--max-inflight-request-mb)"));
  }
  auto granted = std::make_shared<std::promise<Status>>();
  std::future<Status> grant = granted->get_future();
  const internal::RequestBudget::WaiterId waiter =
      s.budget->Acquire(bytes, std::chrono::steady_clock::now() + s.options.admission_wait,
                        [granted](const Status& st) { granted->set_value(st); });
  // The budget answers by its deadline on the server's pool; a pool shut
  // down meanwhile answers nothing, so the wait is bounded here too.
  if (grant.wait_for(s.options.admission_wait + std::chrono::seconds(2)) != std::future_status::ready) {
    if (waiter != 0) s.budget->Cancel(waiter, Status(StatusCode::kUnavailable, "the server is shutting down"));
    if (grant.wait_for(std::chrono::seconds(1)) != std::future_status::ready) {
      return Refused(request.id, Status(StatusCode::kUnavailable, "the server is shutting down"));
    }
  }
  if (Status st = grant.get(); !st.ok()) {
    if (st.code() == StatusCode::kResourceExhausted) s.tenant_stats->CountRefusal(caller.tenant);
    return Refused(request.id, st);
  }
  s.tenant_stats->CountRequest(caller.tenant);
  RequestResult r = s.loop->Submit(std::move(request)).get();
  s.budget->Release(bytes);
  for (const ItemResult& item : r.items) s.tenant_stats->CountItem(caller.tenant, item);
  // ServerOptions::miss_reply_floor, as the Encode RPC holds a miss's item:
  // this front answers once, so a reply with a miss in it waits for the floor.
  if (std::any_of(r.items.begin(), r.items.end(),
                  [&](const ItemResult& item) { return internal::HeldByMissFloor(s.options, item); })) {
    std::this_thread::sleep_until(arrived + s.options.miss_reply_floor);
  }
  return r;
}

bool ServerFrontDoor::serving() const { return s_->serving.load(); }
const std::string& ServerFrontDoor::server_id() const { return s_->options.server_id; }
const WorkerOptions& ServerFrontDoor::worker_options() const { return s_->worker_options; }

FrontTowerInfo ServerFrontDoor::tower() const {
  return FrontTowerInfo{s_->tower_description, s_->tower_hidden, s_->tower_deepstack, s_->tower_dtype};
}

std::int64_t ServerFrontDoor::max_items_per_request() const { return s_->options.max_items_per_request; }

Status ServerFrontDoor::Authorize(const std::optional<std::string>& authorization) const {
  return s_->auth->CheckHeader(authorization);
}

bool ServerFrontDoor::auth_enabled() const { return s_->auth->enabled(); }

StatusOr<CallerIdentity> ServerFrontDoor::Caller(const std::optional<std::string>& authorization,
                                                 const std::optional<std::string>& value, const std::string& ip) const {
  return s_->tenants->Identify(authorization, value, std::nullopt, GrpcPeer(ip));
}

const std::string& ServerFrontDoor::tenant_header() const { return s_->options.tenant_metadata; }
void ServerFrontDoor::ObserveRequest(double seconds) const { s_->metrics->ObserveCall(seconds); }
void ServerFrontDoor::AddMetricsSource(std::function<std::string()> text) const {
  s_->metrics->AddSource(std::move(text));
}
ServerStats ServerFrontDoor::Stats() const { return s_->Snapshot(); }

}  // namespace epd
