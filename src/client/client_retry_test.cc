// Encode's retry policy in the C++ client (proto/epd/v1/encoder_service_config.json).
//
// A real server refuses a call that way only in a race: gRPC cancels a call
// that reaches a server after its shutdown began, before any code of ours
// sees it (CANCELLED), and the server answers UNAVAILABLE in the moment
// between leaving service and that shutdown. No test can hit those moments on
// purpose (tests/deploy/test_cluster_restart.py meets them end to end, by
// chance), so the server here is an Encoder service of the test's own that
// answers each attempt as the test scripts it; the client library, its
// channel and gRPC's retry code are the real ones. Each attempt after the
// first carries gRPC's grpc-previous-rpc-attempts header, which the service
// records. The retryable codes and the attempt limit (4) are written out
// here, not read from the client.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "epd/client/client.h"
#include "epd/v1/encoder.grpc.pb.h"

namespace epd {
namespace {

constexpr int kMaxAttempts = 4;  // encoder_service_config.json: maxAttempts

// What one attempt gets: fail with `code` after sending `after` items, or
// (nullopt) every item and OK.
struct Step {
  grpc::StatusCode code;
  int after;
};

class ScriptedEncoder final : public v1::Encoder::Service {
 public:
  explicit ScriptedEncoder(std::vector<std::optional<Step>> script) : script_(std::move(script)) {}

  grpc::Status Encode(grpc::ServerContext* ctx, const v1::EncodeRequest* req,
                      grpc::ServerWriter<v1::EncodedItem>* writer) override {
    std::size_t n;
    {
      std::lock_guard<std::mutex> lock(mu_);
      n = previous_attempts_.size();
      const auto& md = ctx->client_metadata();
      auto it = md.find("grpc-previous-rpc-attempts");
      previous_attempts_.push_back(it == md.end() ? "" : std::string(it->second.data(), it->second.size()));
    }
    const Step* step = n < script_.size() && script_[n].has_value() ? &*script_[n] : nullptr;
    const std::string why = "scripted failure on attempt " + std::to_string(n + 1);
    for (int i = 0; i < req->items_size(); ++i) {
      if (step != nullptr && i == step->after) return grpc::Status(step->code, why);
      v1::EncodedItem item;
      item.set_index(i);
      item.set_key(std::string(32, static_cast<char>(i)));
      item.set_tokens(1);  // grid 1 x 2 x 2, merged 2 x 2
      item.set_hidden(2);
      item.set_dtype(v1::DTYPE_FLOAT32);
      const float row[2] = {static_cast<float>(i), 0.5F};
      item.set_main(std::string(reinterpret_cast<const char*>(row), sizeof row));
      for (int g : {1, 2, 2}) item.add_grid_thw(g);
      item.set_server_id("scripted");
      writer->Write(item);
    }
    return step != nullptr ? grpc::Status(step->code, why) : grpc::Status::OK;
  }

  std::vector<std::string> previous_attempts() {
    std::lock_guard<std::mutex> lock(mu_);
    return previous_attempts_;
  }

 private:
  const std::vector<std::optional<Step>> script_;
  std::mutex mu_;
  std::vector<std::string> previous_attempts_;  // the header of each attempt ("" = none)
};

class ClientRetryTest : public ::testing::Test {
 protected:
  // Serves `script` on a free loopback port and encodes `n_items` through
  // the client library.
  EncodeResult Run(std::vector<std::optional<Step>> script, int n_items) {
    service_ = std::make_unique<ScriptedEncoder>(std::move(script));
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    EXPECT_NE(port, 0);
    ClientOptions options;
    options.target = "127.0.0.1:" + std::to_string(port);
    options.route_by_key = false;
    options.timeout = std::chrono::seconds(10);
    StatusOr<std::unique_ptr<EncodeClient>> client = EncodeClient::Connect(options);
    EXPECT_TRUE(client.ok()) << client.status().message();
    std::vector<ClientItem> items;
    for (int i = 0; i < n_items; ++i) {
      ClientItem item;
      item.image = "image-" + std::to_string(i);
      items.push_back(std::move(item));
    }
    return (*client)->Encode(std::move(items));
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
    server_.reset();
  }

  static float First(const ClientItemResult& r) {
    float v = -1;
    std::memcpy(&v, r.embedding->main.data(), sizeof v);
    return v;
  }

  std::unique_ptr<ScriptedEncoder> service_;
  std::unique_ptr<grpc::Server> server_;
};

TEST_F(ClientRetryTest, ACallCancelledBeforeAnyItemIsSentAgain) {
  EncodeResult r = Run({Step{grpc::StatusCode::CANCELLED, 0}}, 2);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  ASSERT_EQ(r.items.size(), 2U);
  EXPECT_EQ(First(r.items[0]), 0.0F);
  EXPECT_EQ(First(r.items[1]), 1.0F);
  EXPECT_EQ(service_->previous_attempts(), (std::vector<std::string>{"", "1"}));
}

TEST_F(ClientRetryTest, ACallRefusedUnavailableIsSentAgain) {
  EncodeResult r = Run({Step{grpc::StatusCode::UNAVAILABLE, 0}}, 1);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(service_->previous_attempts(), (std::vector<std::string>{"", "1"}));
}

TEST_F(ClientRetryTest, ItGivesUpAfterFourAttemptsWithTheLastStatus) {
  EncodeResult r = Run(std::vector<std::optional<Step>>(10, Step{grpc::StatusCode::CANCELLED, 0}), 1);
  EXPECT_EQ(r.status.code(), StatusCode::kCancelled);
  EXPECT_NE(r.status.message().find("attempt " + std::to_string(kMaxAttempts)), std::string::npos)
      << r.status.message();
  EXPECT_EQ(service_->previous_attempts(), (std::vector<std::string>{"", "1", "2", "3"}));
}

TEST_F(ClientRetryTest, OtherCodesAreNotRetried) {
  for (grpc::StatusCode code :
       {grpc::StatusCode::INVALID_ARGUMENT, grpc::StatusCode::RESOURCE_EXHAUSTED, grpc::StatusCode::INTERNAL}) {
    EncodeResult r = Run({Step{code, 0}}, 1);
    EXPECT_EQ(static_cast<int>(r.status.code()), static_cast<int>(code));
    EXPECT_EQ(service_->previous_attempts(), (std::vector<std::string>{""})) << static_cast<int>(code);
    TearDown();
  }
}

TEST_F(ClientRetryTest, ACallThatHasSentAnItemIsNotSentAgain) {
  // gRPC commits a call at its first response message: a retry would
  // deliver the items already sent twice.
  EncodeResult r = Run({Step{grpc::StatusCode::CANCELLED, 1}}, 2);
  ASSERT_EQ(r.items.size(), 2U);
  ASSERT_TRUE(r.items[0].status.ok());
  EXPECT_EQ(First(r.items[0]), 0.0F);
  EXPECT_EQ(r.items[1].status.code(), StatusCode::kCancelled);
  EXPECT_EQ(service_->previous_attempts(), (std::vector<std::string>{""}));
}

}  // namespace
}  // namespace epd
