// See call_outcomes.h. A request that never parsed is recognised by its
// POST_RECV_MESSAGE hook, where gRPC hands the interceptor a null message.
#include "call_outcomes.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/server_interceptor.h>

#include <utility>

#include "proto_convert.h"

namespace epd::internal {

RateLimitedLog::RateLimitedLog(std::function<void(const std::string&)> sink, int per_window, Clock::duration window,
                               std::function<Clock::time_point()> now)
    : sink_(std::move(sink)), per_window_(per_window), window_(window), now_(std::move(now)) {}

void RateLimitedLog::Log(const std::string& line) {
  std::lock_guard<std::mutex> lock(mu_);
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
    std::lock_guard<std::mutex> lock(mu_);
    ++errors_[status.code()];
  }
  if (log_ != nullptr) {
    log_->Log(method + " from " + peer + " failed: " + GrpcCodeName(static_cast<int>(status.code())) + ": " +
              status.message());
  }
}

std::map<StatusCode, std::uint64_t> CallOutcomes::Errors() const {
  std::lock_guard<std::mutex> lock(mu_);
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
      unparsed_ = true;
    }
    if (m->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      grpc::Status s = m->GetSendStatus();
      // (Sync methods answer INTERNAL; callback methods UNIMPLEMENTED, with
      // no message.)
      if (unparsed_ &&
          (s.error_code() == grpc::StatusCode::INTERNAL || s.error_code() == grpc::StatusCode::UNIMPLEMENTED)) {
        s = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                         std::string("the request message does not parse as the protobuf ") + info_->method() +
                             " expects; check the client's generated code against proto/epd/v1/encoder.proto");
        m->ModifySendStatus(s);
      }
      const std::string peer = info_->server_context() != nullptr ? info_->server_context()->peer() : "?";
      outcomes_->Record(info_->method(), peer, FromGrpc(s));
    }
    m->Proceed();
  }

 private:
  CallOutcomes* outcomes_;
  grpc::experimental::ServerRpcInfo* info_;
  bool unparsed_ = false;
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
