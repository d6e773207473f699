#include "test_server.h"

#include <gtest/gtest.h>

#include <thread>

namespace epd::testing {

TestServer StartTestServer(TestServerOptions options) {
  TestServer t;
  if (options.server.address == ServerOptions().address) options.server.address = "127.0.0.1:0";
  if (options.worker.model_id.empty()) options.worker.model_id = "test-model";
  options.worker.sink_full = [hold = t.hold] { return hold->load(); };
  t.tower_state = std::make_shared<FakeTowerState>();
  auto tower = std::make_unique<FakeTower>(options.tower, t.tower_state);
  StatusOr<std::unique_ptr<EncodeServer>> s = EncodeServer::Start(options.server, options.worker, std::move(tower));
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  if (!s.ok()) return t;
  t.server = std::move(*s);
  t.target = "127.0.0.1:" + std::to_string(t.server->port());
  t.stub = v1::Encoder::NewStub(grpc::CreateChannel(t.target, grpc::InsecureChannelCredentials()));
  return t;
}

bool WaitFor(const std::function<bool()>& pred) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > give_up) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

RawCall CallEncode(v1::Encoder::Stub& stub, const v1::EncodeRequest& request, std::chrono::milliseconds timeout,
                   const std::string& session_id) {
  RawCall out;
  grpc::ClientContext ctx;
  if (timeout.count() > 0) ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  if (!session_id.empty()) ctx.AddMetadata("x-epd-session", session_id);
  auto reader = stub.Encode(&ctx, request);
  v1::EncodedItem item;
  while (reader->Read(&item)) out.items.push_back(item);
  out.status = reader->Finish();
  return out;
}

std::unique_ptr<v1::Encoder::Stub> NonReadingClientStub(const std::string& target) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 * 1024);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return v1::Encoder::NewStub(grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args));
}

v1::EncodeRequest MakeRequest(const std::string& id, const std::vector<std::string>& images) {
  v1::EncodeRequest r;
  r.set_id(id);
  for (const std::string& img : images) r.add_items()->set_image(img);
  return r;
}

}  // namespace epd::testing
