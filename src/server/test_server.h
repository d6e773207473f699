// src/server/test_server.h (test-only): an in-process EncodeServer over
// FakeTower on a free loopback port, a switch that holds tower batches, and a
// raw stub call that records every streamed message and the final status.
//
// Holding works through WorkerOptions::sink_full: while held, the worker
// keeps accepting requests, cancels and stats (so a test can watch the queue
// through Stats) but starts no tower batch.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "epd/server/server.h"
#include "epd/v1/encoder.grpc.pb.h"
#include "fake_tower.h"

namespace epd::testing {

struct TestServerOptions {
  ServerOptions server;  // address defaults to 127.0.0.1:0 here
  WorkerOptions worker;  // model_id "test-model" unless set
  FakeTowerOptions tower;
};

struct TestServer {
  std::unique_ptr<EncodeServer> server;
  std::shared_ptr<FakeTowerState> tower_state;
  // While true the worker starts no tower batch. Starts false.
  std::shared_ptr<std::atomic<bool>> hold = std::make_shared<std::atomic<bool>>(false);
  std::string target;  // "127.0.0.1:<port>"
  std::unique_ptr<v1::Encoder::Stub> stub;
};

TestServer StartTestServer(TestServerOptions options = {});

// Polls `pred` (e.g. over server->Stats()) until it holds; false after 10 s.
bool WaitFor(const std::function<bool()>& pred);

// The outcome of one Encode call made through the raw stub.
struct RawCall {
  grpc::Status status;
  std::vector<v1::EncodedItem> items;  // in arrival order
};

// Sends `request` and reads the stream to the end. `timeout` 0 = no deadline.
// A non-empty `session_id` goes in the lease-session header (x-epd-session).
RawCall CallEncode(v1::Encoder::Stub& stub, const v1::EncodeRequest& request,
                   std::chrono::milliseconds timeout = std::chrono::milliseconds(10000),
                   const std::string& session_id = "");

// CallEncode with a 10 s deadline, in the lease session `session_id` ("" = none).
inline RawCall CallEncodeIn(v1::Encoder::Stub& stub, const v1::EncodeRequest& request, const std::string& session_id) {
  return CallEncode(stub, request, std::chrono::milliseconds(10000), session_id);
}

// A stub on a channel of its own (not shared with other stubs) whose client
// reads nothing until the test does: no BDP probing, a 64 KiB stream
// window, so a reply larger than that stays in the server's transport.
std::unique_ptr<v1::Encoder::Stub> NonReadingClientStub(const std::string& target);

// A request of one image per string, ids as given.
v1::EncodeRequest MakeRequest(const std::string& id, const std::vector<std::string>& images);

}  // namespace epd::testing
