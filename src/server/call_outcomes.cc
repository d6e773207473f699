// See call_outcomes.h. A request that never parsed is recognised by its
// POST_RECV_MESSAGE hook, where gRPC hands the interceptor a null message.
#include "call_outcomes.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/server_interceptor.h>

#include <atomic>
#include <utility>

#include "epd/core/mutex.h"
#include "proto_convert.h"

namespace epd::internal {

RateLimitedLog::RateLimitedLog(std::function<void(const std::string&)> sink, int per_window, Clock::duration window,
                               std::function<Clock::time_point()> now)
    : sink_(std::move(sink)), per_window_(per_window), window_(window), now_(std::move(now)) {}

void RateLimitedLog::Log(const std::string& line) {
  MutexLock lock(mu_);
  const Clock::time_point t = now_();
  if (in_window_ == 0 || t - window_start_ >= window_) {
    window_start_ = t;
    in_window_ = 0;
  }
  if (in_window_ >= per_window_) {
    ++dropped_;
    return;
  }
  ++in_window_;
  if (dropped_ == 0) {
    sink_(line);
  } else {
    sink_(line + " (" + std::to_string(dropped_) + " earlier line" + (dropped_ == 1 ? "" : "s") +
          " not logged: rate limit)");
    dropped_ = 0;
  }
}

CallOutcomes::CallOutcomes(std::function<void(const std::string&)> log) {
  if (log) log_ = std::make_unique<RateLimitedLog>(std::move(log), 10);
}

void CallOutcomes::Record(const std::string& method, const std::string& peer, const Status& status) {
  if (status.ok()) return;
  {
    MutexLock lock(mu_);
    ++errors_[status.code()];
  }
  if (log_ != nullptr) {
    log_->Log(method + " from " + peer + " failed: " + GrpcCodeName(static_cast<int>(status.code())) + ": " +
              status.message());
  }
}

void CallOutcomes::SetTenantOf(std::function<std::string(const grpc::ServerContextBase&)> tenant_of) {
  tenant_of_ = std::move(tenant_of);
}

std::string CallOutcomes::TenantOf(const grpc::ServerContextBase& ctx) const {
  return tenant_of_ ? tenant_of_(ctx) : std::string();
}

std::map<StatusCode, std::uint64_t> CallOutcomes::Errors() const {
  MutexLock lock(mu_);
  return errors_;
}

namespace {

class OutcomeInterceptor : public grpc::experimental::Interceptor {
 public:
  OutcomeInterceptor(CallOutcomes* outcomes, grpc::experimental::ServerRpcInfo* info)
      : outcomes_(outcomes), info_(info) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* m) override {
    using grpc::experimental::InterceptionHookPoints;
    if (m->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE) && m->GetRecvMessage() == nullptr) {
      unparsed_.store(true);
    }
    if (m->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      grpc::Status s = m->GetSendStatus();
      // (Sync methods answer INTERNAL; callback methods UNIMPLEMENTED, with
      // no message.)
      const bool refused_unparsed = unparsed_.load() && (s.error_code() == grpc::StatusCode::INTERNAL ||
                                                         s.error_code() == grpc::StatusCode::UNIMPLEMENTED);
      if (refused_unparsed) {
        s = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                         std::string("the request message does not parse as the protobuf ") + info_->method() +
                             " expects; check the client's generated code against proto/epd/v1/encoder.proto");
        m->ModifySendStatus(s);
      }
      if (!refused_unparsed || !Callback()) {
        outcomes_->Record(info_->method(), Peer(), ClientEndedOr(FromGrpc(s)));
      } else {
        // No message reached the handler: either it did not parse, or the
        // client cancelled before sending it (gRPC's handler sees the same
        // in both cases). Which one is known once the call closes.
        MutexLock lock(mu_);
        unparsed_status_ = FromGrpc(s);
        status_sent_ = true;
        MaybeRecordUnparsedLocked();
      }
    }
    if (m->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_CLOSE) && unparsed_.load() && Callback()) {
      // Valid here: the call's close has been received. (Only for a callback
      // method: a sync one's IsCancelled completes the close op itself, which
      // runs this hook again, without end.)
      const bool cancelled = info_->server_context()->IsCancelled();
      MutexLock lock(mu_);
      closed_ = true;
      cancelled_ = cancelled;
      MaybeRecordUnparsedLocked();
    }
    m->Proceed();
  }

 private:
  // A callback-API method's call (Encode, Session), as opposed to a sync one.
  bool Callback() const { return dynamic_cast<const grpc::CallbackServerContext*>(info_->server_context()) != nullptr; }

  // The peer, and the caller's tenant when the server names one (the log's
  // "who": tenants.h).
  std::string Peer() const {
    const grpc::ServerContextBase* ctx = info_->server_context();
    if (ctx == nullptr) return "?";
    const std::string tenant = outcomes_->TenantOf(*ctx);
    return tenant.empty() ? ctx->peer() : ctx->peer() + " (tenant " + tenant + ")";
  }

  // `status`, unless it is UNKNOWN on a callback call the client ended: gRPC's
  // health Watch answers a client's cancel (or its deadline) with UNKNOWN
  // "OnCancel()", which is no server error. (IsCancelled is valid at any
  // point of a callback call; a sync one is left as it is.)
  Status ClientEndedOr(Status status) const {
    if (status.code() != StatusCode::kUnknown || !Callback() || !info_->server_context()->IsCancelled()) {
      return status;
    }
    if (info_->server_context()->deadline() <= std::chrono::system_clock::now()) {
      return Status(StatusCode::kDeadlineExceeded,
                    "the call's deadline passed (the service said: " + std::string(status.message()) + ")");
    }
    return Cancelled("the client cancelled the call (the service said: " + std::string(status.message()) + ")");
  }

  // Records the outcome of a call refused for want of a request message once
  // both that refusal was sent and the call's close arrived: a cancel when the
  // client cancelled, else the refusal.
  void MaybeRecordUnparsedLocked() EPD_REQUIRES(mu_) {
    if (!status_sent_ || !closed_ || recorded_) return;
    recorded_ = true;
    outcomes_->Record(
        info_->method(), Peer(),
        cancelled_ ? Cancelled("the client cancelled the call before its request message arrived") : unparsed_status_);
  }

  CallOutcomes* outcomes_;
  grpc::experimental::ServerRpcInfo* info_;
  // Set at POST_RECV_MESSAGE; read at PRE_SEND_STATUS and POST_RECV_CLOSE,
  // which may run on other threads (gRPC's ordering is invisible to TSan,
  // and a streaming method's close may race its last read).
  std::atomic<bool> unparsed_{false};
  // PRE_SEND_STATUS and POST_RECV_CLOSE may run on different threads.
  Mutex mu_;
  Status unparsed_status_ EPD_GUARDED_BY(mu_);
  bool status_sent_ EPD_GUARDED_BY(mu_) = false;  // the refusal was sent
  bool closed_ EPD_GUARDED_BY(mu_) = false;
  bool cancelled_ EPD_GUARDED_BY(mu_) = false;
  bool recorded_ EPD_GUARDED_BY(mu_) = false;
};

class OutcomeInterceptorFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit OutcomeInterceptorFactory(CallOutcomes* outcomes) : outcomes_(outcomes) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override {
    return new OutcomeInterceptor(outcomes_, info);
  }

 private:
  CallOutcomes* outcomes_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> CallOutcomes::MakeInterceptorFactory() {
  return std::make_unique<OutcomeInterceptorFactory>(this);
}

}  // namespace epd::internal
