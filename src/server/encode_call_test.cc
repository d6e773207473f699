// EncodeCall (server.cc, gRPC's callback API) under the ways a call can end
// early: a cancel while it waits for admission, a deadline in the middle of a
// multi-item stream (inline replies built on the TaskPool, shared-memory ones
// on the worker thread), a client whose channel goes away, Shutdown(0) with
// calls in every state, and many concurrent calls with random cancels.
//
// What each test checks is what the server must leave behind: the status the
// client sees, the one failure the server counts (ServerStats::rpc_errors),
// buffered_bytes and the worker's queue back at 0, the request budget free
// again (a new request that needs all of it is admitted), and the server still
// serving. Expected rows come from FakeTower::Reference over an independent
// decode (worker_test_util.h), never from the server.
#include <gmock/gmock.h>
#include <grpcpp/generic/generic_stub.h>
#include <gtest/gtest.h>

#include <future>
#include <random>
#include <set>
#include <thread>

#include "shm_rows.h"
#include "test_server.h"
#include "worker_test_util.h"

namespace epd::testing {
namespace {

using std::chrono::milliseconds;

std::string RowsOf(const Embedding& e) {
  return std::string(reinterpret_cast<const char*>(e.main.data()), e.main.size()) +
         std::string(reinterpret_cast<const char*>(e.deepstack.data()), e.deepstack.size());
}

// The rows an item carries, inline or through a fresh mapping of the arena.
std::string RowsOf(const v1::EncodedItem& item) {
  return item.has_shm() ? ShmRows(item.shm()) : item.main() + item.deepstack();
}

std::uint64_t Errors(const TestServer& t, StatusCode code) {
  const ServerStats s = t.server->Stats();
  const auto it = s.rpc_errors.find(code);
  return it == s.rpc_errors.end() ? 0 : it->second;
}

std::uint64_t AllErrors(const TestServer& t) {
  std::uint64_t n = 0;
  for (const auto& [code, count] : t.server->Stats().rpc_errors) n += count;
  return n;
}

// Nothing of any call is left: no buffered rows, no queued or in-flight
// request in the worker.
std::string ErrorsText(const TestServer& t) {
  std::string out;
  for (const auto& [code, count] : t.server->Stats().rpc_errors) {
    out += std::to_string(static_cast<int>(code)) + ":" + std::to_string(count) + " ";
  }
  return out;
}

std::string StatsText(const TestServer& t) {
  const ServerStats s = t.server->Stats();
  return "buffered_bytes " + std::to_string(s.buffered_bytes) + ", pending_items " +
         std::to_string(s.worker.pending_items) + ", in_flight_requests " +
         std::to_string(s.worker.in_flight_requests) + ", cancelled_requests " +
         std::to_string(s.worker.cancelled_requests);
}

bool Quiet(const TestServer& t) {
  const ServerStats s = t.server->Stats();
  return s.buffered_bytes == 0 && s.worker.pending_items == 0 && s.worker.in_flight_requests == 0;
}

void ExpectServes(TestServer& t, int seed, const FakeTowerOptions& tower = {}) {
  const std::string img = Png(56, 56, seed);
  RawCall r = CallEncode(*t.stub, MakeRequest("after-" + std::to_string(seed), {img}));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_EQ(r.items.size(), 1u);
  EXPECT_TRUE(RowsOf(r.items[0]) == RowsOf(Expected(img, tower))) << "wrong rows";
}

// A call run by hand: started, read item by item, then finished, cancelled
// or abandoned.
struct OpenCall {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Encoder::Stub> stub;
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReader<v1::EncodedItem>> reader;
};

// On a channel of its own, so that destroying it ends only this call.
std::unique_ptr<OpenCall> Open(const std::string& target, const v1::EncodeRequest& req) {
  auto c = std::make_unique<OpenCall>();
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  c->channel = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  c->stub = v1::Encoder::NewStub(c->channel);
  c->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  c->reader = c->stub->Encode(&c->ctx, req);
  return c;
}

// Requests of 1.2 MiB against a 3 MiB budget: two fit, a third waits.
constexpr std::size_t kBig = 1200 << 10;
std::string PaddedPng(int seed) { return Png(56, 56, seed) + std::string(kBig, '\0'); }

TestServerOptions BudgetOptions(std::atomic<int>* drained) {
  TestServerOptions o;
  o.server.max_request_bytes = 1536 << 10;
  o.server.max_inflight_request_bytes = 3 << 20;
  // Long enough that a waiter still waiting when the test looks was not
  // refused for lack of room, and that a server waiting it out would fail
  // WaitFor's 10 s.
  o.server.admission_wait = milliseconds(60000);
  o.server.on_requests_drained = [drained] { ++*drained; };
  return o;
}

TEST(EncodeCallTest, CancelWhileWaitingForAdmissionEndsTheCallAndTakesNoBudget) {
  std::atomic<int> drained{0};
  TestServer t = StartTestServer(BudgetOptions(&drained));
  ASSERT_NE(t.server, nullptr);
  t.hold->store(true);
  std::vector<std::future<RawCall>> big;
  big.reserve(2);
  for (int i = 0; i < 2; ++i) {
    big.push_back(std::async(std::launch::async, [&, i] {
      return CallEncode(*t.stub, MakeRequest("big-" + std::to_string(i), {PaddedPng(i)}), milliseconds(60000));
    }));
  }
  ASSERT_TRUE(WaitFor([&] { return t.server->Stats().worker.in_flight_requests == 2; }));

  auto waiter = Open(t.target, MakeRequest("waiter", {PaddedPng(2)}));
  // Give the request time to reach the server and find the budget full; a
  // cancel that came earlier would test less, not fail.
  std::this_thread::sleep_for(milliseconds(200));
  waiter->ctx.TryCancel();
  v1::EncodedItem item;
  EXPECT_FALSE(waiter->reader->Read(&item));
  EXPECT_EQ(waiter->reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  // The server ends the call now, not at the end of admission_wait.
  ASSERT_TRUE(WaitFor([&] { return Errors(t, StatusCode::kCancelled) == 1; }));
  EXPECT_EQ(t.server->Stats().worker.in_flight_requests, 2);  // never submitted

  t.hold->store(false);
  for (auto& f : big) {
    const RawCall r = f.get();
    EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  }
  // The budget emptied: the two admitted requests left, the waiter held none.
  ASSERT_TRUE(WaitFor([&] { return drained.load() == 1; }));
  ASSERT_TRUE(WaitFor([&] { return Quiet(t); }));
  // And all of it is free again: two more big requests are admitted at once.
  t.hold->store(true);
  std::vector<std::future<RawCall>> again;
  for (int i = 3; i < 5; ++i) {
    again.push_back(std::async(std::launch::async, [&, i] {
      return CallEncode(*t.stub, MakeRequest("again-" + std::to_string(i), {PaddedPng(i)}), milliseconds(60000));
    }));
  }
  EXPECT_TRUE(WaitFor([&] { return t.server->Stats().worker.in_flight_requests == 2; }));
  t.hold->store(false);
  for (auto& f : again) EXPECT_TRUE(f.get().status.ok());
  EXPECT_EQ(AllErrors(t), 1u);
}

TEST(EncodeCallTest, ACallWaitingForTheBudgetGoesInWhenAnEarlierCallEnds) {
  std::atomic<int> drained{0};
  TestServer t = StartTestServer(BudgetOptions(&drained));
  ASSERT_NE(t.server, nullptr);
  t.hold->store(true);
  std::vector<std::future<RawCall>> calls;
  for (int i = 0; i < 3; ++i) {
    calls.push_back(std::async(std::launch::async, [&, i] {
      return CallEncode(*t.stub, MakeRequest("queued-" + std::to_string(i), {PaddedPng(20 + i)}), milliseconds(60000));
    }));
    if (i == 1) {
      ASSERT_TRUE(WaitFor([&] { return t.server->Stats().worker.in_flight_requests == 2; }));
    }
  }
  // The third waits in the budget's queue, not in the worker.
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_EQ(t.server->Stats().worker.in_flight_requests, 2);
  t.hold->store(false);
  for (int i = 0; i < 3; ++i) {
    const RawCall r = calls[static_cast<std::size_t>(i)].get();
    ASSERT_TRUE(r.status.ok()) << i << ": " << r.status.error_message();
    ASSERT_EQ(r.items.size(), 1u);
    EXPECT_TRUE(RowsOf(r.items[0]) == RowsOf(Expected(PaddedPng(20 + i)))) << "wrong rows for " << i;
  }
  EXPECT_EQ(AllErrors(t), 0u);
  ASSERT_TRUE(WaitFor([&] { return Quiet(t) && drained.load() >= 1; }));
}

// A deadline that passes after two of three items were sent: the client
// has those two, the server counts one DEADLINE_EXCEEDED, cancels the rest in
// the worker and keeps no buffered bytes.
void DeadlineMidStream(bool shm) {
  TestServerOptions o;
  if (shm) o.server.shm_arena_bytes = 8 << 20;
  TestServer t = StartTestServer(o);
  ASSERT_NE(t.server, nullptr);
  const std::string a = Png(56, 56, 40), b = Png(84, 56, 41), miss = Png(56, 56, 42);
  ASSERT_TRUE(CallEncode(*t.stub, MakeRequest("warm", {a, b})).status.ok());
  t.hold->store(true);
  v1::EncodeRequest req = MakeRequest("late", {a, b, miss});
  if (shm) req.set_delivery(v1::DELIVERY_SHM);
  RawCall r = CallEncode(*t.stub, req, milliseconds(1000));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << r.status.error_message();
  ASSERT_EQ(r.items.size(), 2u);
  std::set<std::int64_t> seen;
  for (const v1::EncodedItem& item : r.items) {
    ASSERT_TRUE(item.index() == 0 || item.index() == 1) << item.index();
    EXPECT_TRUE(seen.insert(item.index()).second);
    EXPECT_EQ(item.has_shm(), shm);
    EXPECT_TRUE(RowsOf(item) == RowsOf(Expected(item.index() == 0 ? a : b))) << "wrong rows";
  }
  ASSERT_TRUE(WaitFor([&] {
    return Errors(t, StatusCode::kDeadlineExceeded) == 1 && t.server->Stats().worker.cancelled_requests == 1 &&
           Quiet(t);
  })) << ErrorsText(t)
      << StatsText(t);
  EXPECT_EQ(AllErrors(t), 1u);
  t.hold->store(false);
  ExpectServes(t, 43);
  EXPECT_EQ(t.tower_state->items_encoded(), 3);  // the warm-up's two and ExpectServes' one
  EXPECT_EQ(AllErrors(t), 1u);
}

TEST(EncodeCallTest, DeadlineMidStreamInlineCountsOnceAndFreesBufferedBytes) { DeadlineMidStream(false); }
TEST(EncodeCallTest, DeadlineMidStreamShmCountsOnceAndFreesBufferedBytes) { DeadlineMidStream(true); }

TEST(EncodeCallTest, ClientWhoseChannelGoesAwayMidStreamIsCancelledInTheWorker) {
  TestServer t = StartTestServer();
  const std::string a = Png(56, 56, 50), miss = Png(56, 56, 51);
  ASSERT_TRUE(CallEncode(*t.stub, MakeRequest("warm", {a})).status.ok());
  t.hold->store(true);
  auto c = Open(t.target, MakeRequest("gone", {a, miss}));
  v1::EncodedItem item;
  ASSERT_TRUE(c->reader->Read(&item));
  EXPECT_EQ(item.index(), 0);
  EXPECT_TRUE(RowsOf(item) == RowsOf(Expected(a))) << "wrong rows";
  ASSERT_TRUE(WaitFor([&] { return t.server->Stats().worker.pending_items == 1; }));
  // No Finish, no TryCancel: the reader, stub and channel just go away.
  c->reader.reset();
  c->stub.reset();
  c->channel.reset();
  c.reset();
  ASSERT_TRUE(WaitFor([&] {
    return Errors(t, StatusCode::kCancelled) == 1 && t.server->Stats().worker.cancelled_requests == 1 && Quiet(t);
  })) << ErrorsText(t)
      << StatsText(t);
  t.hold->store(false);
  ExpectServes(t, 52);
  EXPECT_EQ(AllErrors(t), 1u);
}

// A client that reads nothing, then goes away, with megabytes of rows queued
// on its call and a write in flight: every buffered byte comes back.
TEST(EncodeCallTest, NonReadingClientThatGoesAwayLeavesNoBufferedBytes) {
  TestServerOptions o;
  o.tower.hidden = 1 << 14;  // 0.75 MiB per 56x56 item (larger rows only slow TSan down)
  TestServer t = StartTestServer(o);
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 * 1024);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto channel = grpc::CreateCustomChannel(t.target, grpc::InsecureChannelCredentials(), args);
  auto stub = v1::Encoder::NewStub(channel);
  auto ctx = std::make_unique<grpc::ClientContext>();
  auto reader = stub->Encode(ctx.get(), MakeRequest("slow", {Png(56, 56, 53), Png(56, 56, 54), Png(56, 56, 55)}));
  // The first write cannot complete in a 64 KiB window: all three results
  // (2.25 MiB) stay counted.
  ASSERT_TRUE(WaitFor([&] { return t.server->Stats().buffered_bytes > (2 << 20); }));
  ctx->TryCancel();
  reader.reset();
  ctx.reset();
  stub.reset();
  channel.reset();
  ASSERT_TRUE(WaitFor([&] { return Errors(t, StatusCode::kCancelled) == 1 && Quiet(t); }))
      << ErrorsText(t) << StatsText(t);
  EXPECT_EQ(AllErrors(t), 1u);
  ExpectServes(t, 56, o.tower);
}

// Shutdown(0) with a call waiting for admission, two admitted ones queued
// behind a held tower, and a call whose client reads nothing: Shutdown
// returns, every call ends with an error, and no call hangs.
TEST(EncodeCallTest, ShutdownZeroEndsWaitingQueuedAndStreamingCalls) {
  std::atomic<int> drained{0};
  TestServerOptions o = BudgetOptions(&drained);
  o.server.shm_arena_bytes = 8 << 20;
  o.tower.hidden = 1 << 12;  // 192 KiB per 56x56 item
  TestServer t = StartTestServer(o);
  ASSERT_NE(t.server, nullptr);

  // Streaming: two hits and a held miss for a client that reads only the
  // first.
  const std::string a = Png(56, 56, 60), b = Png(56, 56, 61);
  const RawCall warm = CallEncode(*t.stub, MakeRequest("warm", {a, b}));
  ASSERT_TRUE(warm.status.ok()) << warm.status.error_message();
  t.hold->store(true);
  auto streaming = Open(t.target, MakeRequest("streaming", {a, b, Png(56, 56, 62)}));
  v1::EncodedItem item;
  ASSERT_TRUE(streaming->reader->Read(&item));
  std::vector<std::future<RawCall>> calls;
  calls.reserve(2);
  for (int i = 0; i < 2; ++i) {
    calls.push_back(std::async(std::launch::async, [&, i] {
      return CallEncode(*t.stub, MakeRequest("big-" + std::to_string(i), {PaddedPng(10 + i)}), milliseconds(60000));
    }));
  }
  ASSERT_TRUE(WaitFor([&] { return t.server->Stats().worker.in_flight_requests == 3; }));
  // Two more wait for admission, one inline, one by shared memory.
  for (int i = 2; i < 4; ++i) {
    calls.push_back(std::async(std::launch::async, [&, i] {
      v1::EncodeRequest req = MakeRequest("big-" + std::to_string(i), {PaddedPng(10 + i)});
      if (i == 3) req.set_delivery(v1::DELIVERY_SHM);
      return CallEncode(*t.stub, req, milliseconds(60000));
    }));
  }
  std::this_thread::sleep_for(milliseconds(200));  // let them reach the budget

  auto stopping = std::async(std::launch::async, [&] { t.server->Shutdown(milliseconds(0)); });
  ASSERT_EQ(stopping.wait_for(std::chrono::seconds(30)), std::future_status::ready) << "Shutdown(0) hangs";
  for (auto& f : calls) {
    ASSERT_EQ(f.wait_for(std::chrono::seconds(30)), std::future_status::ready) << "a call hangs";
    const RawCall r = f.get();
    EXPECT_FALSE(r.status.ok());
    EXPECT_TRUE(r.items.empty());
  }
  while (streaming->reader->Read(&item)) {
  }
  EXPECT_FALSE(streaming->reader->Finish().ok());
  EXPECT_EQ(t.server->Stats().buffered_bytes, 0);
}

// Many concurrent multi-item calls mixing hits and misses, inline and shared
// memory, with random cancels: every call not cancelled gets each of its
// items exactly once with the rows FakeTower makes for it; nothing is left
// behind; the only failures counted are cancels.
TEST(EncodeCallTest, ConcurrentCallsWithRandomCancelsGetEveryItemOnceWithTheRightRows) {
  TestServerOptions o;
  o.server.shm_arena_bytes = 16 << 20;
  TestServer t = StartTestServer(o);
  ASSERT_NE(t.server, nullptr);
  std::vector<std::string> images;
  std::vector<std::string> want;
  for (int i = 0; i < 12; ++i) {
    images.push_back(Png(56 + 28 * (i % 3), 56, 70 + i));
    want.push_back(RowsOf(Expected(images.back())));
  }
  // Half of them cached before the burst.
  ASSERT_TRUE(
      CallEncode(*t.stub, MakeRequest("warm", {images[0], images[2], images[4], images[6], images[8], images[10]}))
          .status.ok());

  constexpr int kThreads = 6, kCallsPerThread = 12;
  std::atomic<int> cancels_seen{0}, completed{0};
  auto run = [&](int thread) {
    std::mt19937 rng(1000 + thread);
    for (int c = 0; c < kCallsPerThread; ++c) {
      const int n = 1 + static_cast<int>(rng() % 4);
      std::vector<int> which;
      v1::EncodeRequest req;
      req.set_id("t" + std::to_string(thread) + "-" + std::to_string(c));
      for (int k = 0; k < n; ++k) {
        which.push_back(static_cast<int>(rng() % images.size()));
        req.add_items()->set_image(images[which.back()]);
      }
      const bool shm = rng() % 2 == 0;
      if (shm) req.set_delivery(v1::DELIVERY_SHM);
      const bool cancel = rng() % 4 == 0;
      const int cancel_after = static_cast<int>(rng() % n);  // items read before the cancel

      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
      auto reader = t.stub->Encode(&ctx, req);
      std::vector<v1::EncodedItem> got;
      v1::EncodedItem item;
      if (cancel && cancel_after == 0) ctx.TryCancel();
      while (reader->Read(&item)) {
        got.push_back(item);
        if (cancel && static_cast<int>(got.size()) == cancel_after) ctx.TryCancel();
      }
      const grpc::Status st = reader->Finish();
      std::set<std::int64_t> seen;
      for (const v1::EncodedItem& g : got) {
        ASSERT_GE(g.index(), 0);
        ASSERT_LT(g.index(), n);
        EXPECT_TRUE(seen.insert(g.index()).second) << req.id() << ": index " << g.index() << " twice";
        EXPECT_EQ(g.error_code(), 0) << g.error_message();
        EXPECT_EQ(g.has_shm(), shm) << req.id();
        EXPECT_TRUE(RowsOf(g) == want[which[g.index()]]) << req.id() << " index " << g.index() << ": wrong rows";
      }
      if (cancel && st.error_code() == grpc::StatusCode::CANCELLED) {
        ++cancels_seen;
        continue;
      }
      // Not cancelled, or it finished before the cancel did.
      EXPECT_TRUE(st.ok()) << req.id() << ": " << st.error_code() << " " << st.error_message();
      EXPECT_EQ(static_cast<int>(got.size()), n) << req.id();
      ++completed;
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int i = 0; i < kThreads; ++i) threads.emplace_back(run, i);
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(cancels_seen.load() + completed.load(), kThreads * kCallsPerThread);
  EXPECT_GT(completed.load(), 0);
  ASSERT_TRUE(WaitFor([&] { return Quiet(t); }));
  // A cancel the server saw is counted once; one that came after the status
  // was sent is not counted.
  EXPECT_LE(Errors(t, StatusCode::kCancelled), static_cast<std::uint64_t>(cancels_seen.load()));
  EXPECT_EQ(AllErrors(t), Errors(t, StatusCode::kCancelled)) << ErrorsText(t);
  ExpectServes(t, 90);
}

// A client that opens an Encode call and cancels it before its request
// message arrives: the server counts a cancel, not a malformed request (gRPC
// hands the handler no message in both cases). A client that half-closes
// without a message did send a bad request, and is counted so.
TEST(EncodeCallTest, CancelBeforeTheRequestMessageIsCountedAsCancelNotInvalidArgument) {
  TestServer t = StartTestServer();
  for (const bool cancel : {true, false}) {
    grpc::GenericStub stub(grpc::CreateChannel(t.target, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::CompletionQueue cq;
    std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call = stub.PrepareCall(&ctx, "/epd.v1.Encoder/Encode", &cq);
    void* tag;
    bool ok;
    call->StartCall(reinterpret_cast<void*>(1));  // headers only
    cq.Next(&tag, &ok);
    if (cancel) {
      // Let the headers reach the server first; a cancel that came earlier
      // would never reach a handler, and nothing would be counted.
      std::this_thread::sleep_for(milliseconds(200));
      ctx.TryCancel();
    } else {
      call->WritesDone(reinterpret_cast<void*>(2));
      cq.Next(&tag, &ok);
    }
    grpc::Status status;
    call->Finish(&status, reinterpret_cast<void*>(3));
    cq.Next(&tag, &ok);
    EXPECT_EQ(status.error_code(), cancel ? grpc::StatusCode::CANCELLED : grpc::StatusCode::INVALID_ARGUMENT)
        << status.error_message();
    cq.Shutdown();
    while (cq.Next(&tag, &ok)) {
    }
    if (cancel) {
      EXPECT_TRUE(WaitFor([&] { return AllErrors(t) == 1; })) << ErrorsText(t);
      EXPECT_EQ(Errors(t, StatusCode::kCancelled), 1u) << ErrorsText(t);
    } else {
      EXPECT_TRUE(WaitFor([&] { return AllErrors(t) == 2; })) << ErrorsText(t);
      EXPECT_EQ(Errors(t, StatusCode::kInvalidArgument), 1u) << ErrorsText(t);
    }
  }
  ExpectServes(t, 95);
}

// The same refusal for a sync method (Release): a request that does not
// parse is INVALID_ARGUMENT to the client and counted once as such, now that
// the count waits for the call's close.
TEST(EncodeCallTest, MalformedRequestToASyncMethodIsCountedOnceAsInvalidArgument) {
  TestServer t = StartTestServer();
  grpc::GenericStub stub(grpc::CreateChannel(t.target, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::CompletionQueue cq;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call = stub.PrepareCall(&ctx, "/epd.v1.Encoder/Release", &cq);
  void* tag;
  bool ok;
  call->StartCall(reinterpret_cast<void*>(1));
  cq.Next(&tag, &ok);
  // Field 1 (leases, a message) declares 100 bytes but carries 2.
  grpc::Slice slice(std::string("\x0a\x64xy", 4));
  grpc::ByteBuffer body(&slice, 1);
  call->Write(body, reinterpret_cast<void*>(2));
  cq.Next(&tag, &ok);
  call->WritesDone(reinterpret_cast<void*>(3));
  cq.Next(&tag, &ok);
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(4));
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_TRUE(WaitFor([&] { return AllErrors(t) == 1; })) << ErrorsText(t);
  EXPECT_EQ(Errors(t, StatusCode::kInvalidArgument), 1u) << ErrorsText(t);
  ExpectServes(t, 96);
  EXPECT_EQ(AllErrors(t), 1u) << ErrorsText(t);
}

// Items that fail do not stop the others; the call's status names the lowest
// failed index, whatever order the failures were delivered in.
TEST(EncodeCallTest, FailedItemsLetTheOthersThroughAndTheStatusNamesTheLowestIndex) {
  TestServer t = StartTestServer();
  const std::string g0 = Png(56, 56, 80), g2 = Png(84, 56, 81);
  RawCall r = CallEncode(*t.stub, MakeRequest("bad", {g0, "not an image", g2, "neither is this"}));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(r.status.error_message().rfind("item 1: ", 0), 0u) << r.status.error_message();
  EXPECT_NE(r.status.error_message().find("2 of 4 items failed"), std::string::npos) << r.status.error_message();
  ASSERT_EQ(r.items.size(), 4u);
  std::set<std::int64_t> seen;
  for (const v1::EncodedItem& item : r.items) {
    EXPECT_TRUE(seen.insert(item.index()).second);
    if (item.index() % 2 == 0) {
      EXPECT_EQ(item.error_code(), 0);
      EXPECT_TRUE(RowsOf(item) == RowsOf(Expected(item.index() == 0 ? g0 : g2))) << "wrong rows";
    } else {
      EXPECT_EQ(item.error_code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
      EXPECT_TRUE(item.main().empty());
    }
  }
  EXPECT_EQ(seen.size(), 4u);

  // Item 0 fails in the tower, after item 2 failed to decode: still item 0.
  const std::string hit = Png(56, 56, 82);
  ASSERT_TRUE(CallEncode(*t.stub, MakeRequest("warm", {hit})).status.ok());
  t.hold->store(true);
  auto late = std::async(std::launch::async, [&] {
    return CallEncode(*t.stub, MakeRequest("late", {Png(56, 56, 83), hit, "junk"}));
  });
  ASSERT_TRUE(WaitFor([&] { return t.server->Stats().worker.pending_items == 1; }));
  t.tower_state->fail_next = Internal("injected tower failure");
  t.hold->store(false);
  const RawCall l = late.get();
  EXPECT_EQ(l.status.error_code(), grpc::StatusCode::INTERNAL) << l.status.error_message();
  EXPECT_EQ(l.status.error_message().rfind("item 0: ", 0), 0u) << l.status.error_message();
  EXPECT_NE(l.status.error_message().find("injected tower failure"), std::string::npos);
  EXPECT_NE(l.status.error_message().find("2 of 3 items failed"), std::string::npos) << l.status.error_message();
  ASSERT_EQ(l.items.size(), 3u);
  for (const v1::EncodedItem& item : l.items) {
    if (item.index() == 1) {
      EXPECT_TRUE(RowsOf(item) == RowsOf(Expected(hit))) << "wrong rows";
    }
  }
  ExpectServes(t, 84);
}

// Two 1.2 MiB calls held in the worker, and a third waiting for the budget,
// when Shutdown(grace) begins. Returns the three calls' futures.
std::vector<std::future<RawCall>> TwoInFlightAndOneWaiting(TestServer& t, int seed) {
  t.hold->store(true);
  std::vector<std::future<RawCall>> calls;
  for (int i = 0; i < 3; ++i) {
    calls.push_back(std::async(std::launch::async, [&t, seed, i] {
      return CallEncode(*t.stub, MakeRequest("graced-" + std::to_string(i), {PaddedPng(seed + i)}),
                        milliseconds(60000));
    }));
    if (i == 1) {
      EXPECT_TRUE(WaitFor([&] { return t.server->Stats().worker.in_flight_requests == 2; }));
    }
  }
  EXPECT_TRUE(WaitFor([&] { return t.server->Stats().admission_waiting == 1; }));
  EXPECT_EQ(t.server->Stats().worker.in_flight_requests, 2);
  return calls;
}

// Shutdown with a grace lets calls already started finish, the one waiting
// for the budget included: it goes in when an earlier call's bytes come
// back, and is served.
TEST(EncodeCallTest, ShutdownWithAGraceServesACallWaitingForTheBudget) {
  std::atomic<int> drained{0};
  TestServer t = StartTestServer(BudgetOptions(&drained));
  ASSERT_NE(t.server, nullptr);
  std::vector<std::future<RawCall>> calls = TwoInFlightAndOneWaiting(t, 40);
  auto stopping = std::async(std::launch::async, [&] { t.server->Shutdown(milliseconds(30000)); });
  // Once the shutdown has begun (Health says not serving), the three go on.
  ASSERT_TRUE(WaitFor([&] {
    grpc::ClientContext ctx;
    v1::HealthResponse health;
    const grpc::Status st = t.stub->Health(&ctx, v1::HealthRequest(), &health);
    return !st.ok() || !health.serving();
  }));
  t.hold->store(false);
  for (int i = 0; i < 3; ++i) {
    const RawCall r = calls[static_cast<std::size_t>(i)].get();
    ASSERT_TRUE(r.status.ok()) << i << ": " << r.status.error_message();
    ASSERT_EQ(r.items.size(), 1u);
    EXPECT_TRUE(RowsOf(r.items[0]) == RowsOf(Expected(PaddedPng(40 + i)))) << "wrong rows for " << i;
  }
  ASSERT_EQ(stopping.wait_for(std::chrono::seconds(30)), std::future_status::ready) << "Shutdown hangs";
  EXPECT_EQ(drained.load(), 1);  // all three calls' bytes came back
  EXPECT_EQ(t.server->Stats().request_bytes_in_flight, 0);
}

// A grace that runs out with the tower still held: every call, the one
// waiting for the budget included, ends once, not OK; the budget is empty
// again (the waiter held none of it).
TEST(EncodeCallTest, ShutdownWhoseGraceRunsOutEndsACallWaitingForTheBudgetOnce) {
  std::atomic<int> drained{0};
  TestServer t = StartTestServer(BudgetOptions(&drained));
  ASSERT_NE(t.server, nullptr);
  std::vector<std::future<RawCall>> calls = TwoInFlightAndOneWaiting(t, 45);
  auto stopping = std::async(std::launch::async, [&] { t.server->Shutdown(milliseconds(300)); });
  ASSERT_EQ(stopping.wait_for(std::chrono::seconds(30)), std::future_status::ready) << "Shutdown hangs";
  for (auto& f : calls) {
    ASSERT_EQ(f.wait_for(std::chrono::seconds(30)), std::future_status::ready) << "a call hangs";
    const RawCall r = f.get();
    EXPECT_FALSE(r.status.ok());
    EXPECT_TRUE(r.items.empty());
  }
  EXPECT_EQ(AllErrors(t), 3u) << ErrorsText(t);
  EXPECT_EQ(drained.load(), 1);
  const ServerStats s = t.server->Stats();
  EXPECT_EQ(s.buffered_bytes, 0);
  EXPECT_EQ(s.request_bytes_in_flight, 0);
  EXPECT_EQ(s.admission_waiting, 0);
}

// admission_wait 0: a call that finds the budget full is refused at once,
// counted once, and takes nothing.
TEST(EncodeCallTest, AdmissionWaitZeroRefusesACallThatDoesNotFitAtOnce) {
  std::atomic<int> drained{0};
  TestServerOptions o = BudgetOptions(&drained);
  o.server.admission_wait = milliseconds(0);
  TestServer t = StartTestServer(o);
  ASSERT_NE(t.server, nullptr);
  t.hold->store(true);
  std::vector<std::future<RawCall>> big;
  big.reserve(2);
  for (int i = 0; i < 2; ++i) {
    big.push_back(std::async(std::launch::async, [&, i] {
      return CallEncode(*t.stub, MakeRequest("big-" + std::to_string(i), {PaddedPng(50 + i)}), milliseconds(60000));
    }));
  }
  ASSERT_TRUE(WaitFor([&] { return t.server->Stats().worker.in_flight_requests == 2; }));
  const RawCall third = CallEncode(*t.stub, MakeRequest("third", {PaddedPng(52)}), milliseconds(60000));
  EXPECT_EQ(third.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(third.status.error_message(), ::testing::HasSubstr("in-flight request budget of 3.0 MiB"));
  EXPECT_EQ(Errors(t, StatusCode::kResourceExhausted), 1u);
  t.hold->store(false);
  for (auto& f : big) EXPECT_TRUE(f.get().status.ok());
  ASSERT_TRUE(WaitFor([&] { return drained.load() == 1 && Quiet(t); }));
  EXPECT_EQ(AllErrors(t), 1u);
}

// A budget of exactly one largest request (1.5 MiB), one call of 1.2 MiB in
// the worker, and five more sent at once: they wait in the budget's queue
// and go in one at a time, and all six are served. gRPC's memory quota,
// sized from the budget, used to be smaller than what the transport
// allocates to read a few such uploads (read buffers of up to 4 MiB a
// connection), and gRPC reset streams under the pressure (RST_STREAM
// ENHANCE_YOUR_CALM), oldest first: the admitted call too.
TEST(EncodeCallTest, ABudgetOfOneRequestQueuesABurstAndServesItOneAtATime) {
  std::atomic<int> drained{0};
  TestServerOptions o = BudgetOptions(&drained);
  o.server.max_inflight_request_bytes = o.server.max_request_bytes;
  TestServer t = StartTestServer(o);
  ASSERT_NE(t.server, nullptr);
  t.hold->store(true);
  constexpr int kCalls = 6;
  std::vector<std::future<RawCall>> calls;
  for (int i = 0; i < kCalls; ++i) {
    calls.push_back(std::async(std::launch::async, [&, i] {
      return CallEncode(*t.stub, MakeRequest("one-" + std::to_string(i), {PaddedPng(55 + i)}), milliseconds(60000));
    }));
    if (i == 0) {
      ASSERT_TRUE(WaitFor([&] { return t.server->Stats().worker.in_flight_requests == 1; }));
    }
  }
  ASSERT_TRUE(WaitFor([&] { return t.server->Stats().admission_waiting == kCalls - 1; }));
  EXPECT_EQ(t.server->Stats().worker.in_flight_requests, 1);  // the other five wait in the budget
  t.hold->store(false);
  for (int i = 0; i < kCalls; ++i) {
    const RawCall r = calls[static_cast<std::size_t>(i)].get();
    ASSERT_TRUE(r.status.ok()) << i << ": " << r.status.error_message();
    ASSERT_EQ(r.items.size(), 1u);
    EXPECT_TRUE(RowsOf(r.items[0]) == RowsOf(Expected(PaddedPng(55 + i)))) << "wrong rows for " << i;
  }
  EXPECT_EQ(AllErrors(t), 0u) << ErrorsText(t);
  ASSERT_TRUE(WaitFor([&] { return Quiet(t) && t.server->Stats().request_bytes_in_flight == 0; }));
}

}  // namespace
}  // namespace epd::testing
