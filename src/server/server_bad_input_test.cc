// Bad input against a real in-process server: each case gets the documented
// gRPC status with a message that names the problem, and the same server
// then serves a good request.
#include <grpcpp/generic/generic_stub.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <future>
#include <mutex>

#include "test_server.h"
#include "worker_test_util.h"

namespace epd::testing {
namespace {

using std::chrono::milliseconds;

// The server still answers a good request correctly.
void ExpectStillServing(TestServer& t) {
  const std::string img = Png(56, 56, 99);
  RawCall r = CallEncode(*t.stub, MakeRequest("after", {img}));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_EQ(r.items.size(), 1u);
  const Embedding want = Expected(img);
  EXPECT_EQ(r.items[0].main(), std::string(reinterpret_cast<const char*>(want.main.data()), want.main.size()));
}

bool Contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(ServerBadInputTest, RequestWithoutItemsIsInvalidArgument) {
  TestServer t = StartTestServer();
  RawCall r = CallEncode(*t.stub, MakeRequest("none", {}));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(r.status.error_message(), "no items")) << r.status.error_message();
  ExpectStillServing(t);
}

TEST(ServerBadInputTest, ItemWithNeitherImageNorKeyIsInvalidArgument) {
  TestServer t = StartTestServer();
  v1::EncodeRequest req = MakeRequest("empty-item", {Png(56, 56, 1)});
  req.add_items();  // item 1: nothing set
  RawCall r = CallEncode(*t.stub, req);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(r.status.error_message(), "item 1 is empty")) << r.status.error_message();
  EXPECT_TRUE(r.items.empty());  // a malformed request is refused whole
  EXPECT_EQ(t.server->Stats().worker.requests, 0u);
  ExpectStillServing(t);
}

TEST(ServerBadInputTest, TooManyItemsIsInvalidArgument) {
  TestServerOptions o;
  o.server.max_items_per_request = 2;
  TestServer t = StartTestServer(o);
  const std::string img = Png(56, 56, 2);
  RawCall r = CallEncode(*t.stub, MakeRequest("many", {img, img, img}));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(r.status.error_message(), "at most 2")) << r.status.error_message();
  ExpectStillServing(t);
}

TEST(ServerBadInputTest, NegativeExpectedTokensIsInvalidArgument) {
  TestServer t = StartTestServer();
  v1::EncodeRequest req = MakeRequest("neg", {Png(56, 56, 3)});
  req.mutable_items(0)->set_expected_tokens(-1);
  RawCall r = CallEncode(*t.stub, req);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(r.status.error_message(), "expected_tokens is -1")) << r.status.error_message();
  ExpectStillServing(t);
}

TEST(ServerBadInputTest, ExpectedTokensThatDisagreeWithTheImageIsInvalidArgument) {
  TestServer t = StartTestServer();
  // 56x56 -> grid 1x4x4 -> 16 patches -> 4 tokens after the 2x2 merge.
  v1::EncodeRequest req = MakeRequest("tokens", {Png(56, 56, 4)});
  req.mutable_items(0)->set_expected_tokens(5);
  RawCall r = CallEncode(*t.stub, req);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(r.status.error_message(), "expected_tokens is 5 but the 56x56 image gives 4 tokens"))
      << r.status.error_message();
  req.mutable_items(0)->set_expected_tokens(4);
  req.set_id("tokens-right");
  EXPECT_TRUE(CallEncode(*t.stub, req).status.ok());
}

TEST(ServerBadInputTest, UndecodableImageIsInvalidArgumentAndTheOtherItemsStillStream) {
  TestServer t = StartTestServer();
  const std::string good = Png(56, 56, 5);
  RawCall r = CallEncode(*t.stub, MakeRequest("garbage", {good, "this is not an image"}));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(r.status.error_message(), "item 1: ")) << r.status.error_message();
  EXPECT_TRUE(Contains(r.status.error_message(), "unsupported image format")) << r.status.error_message();
  EXPECT_TRUE(Contains(r.status.error_message(), "1 of 2 items failed")) << r.status.error_message();
  ASSERT_EQ(r.items.size(), 2u);
  for (const v1::EncodedItem& item : r.items) {
    if (item.index() == 0) {
      EXPECT_EQ(item.error_code(), 0);
      EXPECT_FALSE(item.main().empty());
    } else {
      EXPECT_EQ(item.error_code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
      EXPECT_TRUE(item.main().empty());
    }
  }
  ExpectStillServing(t);
}

TEST(ServerBadInputTest, TruncatedImageIsInvalidArgument) {
  TestServer t = StartTestServer();
  RawCall r = CallEncode(*t.stub, MakeRequest("half", {ToString(FirstHalf(ToBytes(Png(64, 64, 6))))}));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(r.status.error_message(), "item 0: ")) << r.status.error_message();
  ExpectStillServing(t);
}

TEST(ServerBadInputTest, ImageWithTooManyPixelsIsInvalidArgument) {
  TestServerOptions o;
  o.worker.limits.max_pixels = std::int64_t{100} * 100;
  TestServer t = StartTestServer(o);
  RawCall r = CallEncode(*t.stub, MakeRequest("big", {Png(200, 120, 7)}));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(r.status.error_message(), "too many pixels")) << r.status.error_message();
  ExpectStillServing(t);
}

TEST(ServerBadInputTest, EveryFormatsTruncatedCorruptAndLyingFilesAreInvalidArgumentNamingTheProblem) {
  TestServer t = StartTestServer();
  const RgbImage img = PatternImage(64, 48);
  const Bytes palette = {0, 0, 0, 255, 255, 255};
  const Bytes gif = EncodeGif(64, 48, 0, 0, 64, 48, Bytes(std::size_t{64} * 48, 1), palette);
  const Bytes webp = EncodeWebpLosslessRgb(img);
  const Bytes bmp = EncodeBmp24(img);
  Bytes lying_gif = gif;
  lying_gif[6] = lying_gif[7] = lying_gif[8] = lying_gif[9] = 0xff;  // 65535x65535 screen
  Bytes corrupt_webp = webp;
  corrupt_webp[12] = 'X';  // the image chunk's type
  Bytes corrupt_bmp = bmp;
  corrupt_bmp[14] = 99;  // info header size
  Bytes cmyk_jpeg = EncodeJpegCmyk(16, 16, Bytes(std::size_t{16} * 16 * 4, 100), 90);
  struct Case {
    std::string name;
    Bytes bytes;
    std::string says;
  };
  const Case cases[] = {
      {"truncated-png", FirstHalf(EncodePngRgb(img)), "corrupt or truncated PNG data"},
      {"truncated-jpeg", FirstHalf(EncodeJpegRgb(img, 90)), "corrupt or truncated JPEG data"},
      {"truncated-cmyk-jpeg", FirstHalf(cmyk_jpeg), "corrupt or truncated JPEG data"},
      {"truncated-webp", FirstHalf(webp), "corrupt or truncated WebP data"},
      {"corrupt-webp", corrupt_webp, "corrupt or truncated WebP data"},
      {"truncated-gif", FirstHalf(gif), "corrupt or truncated GIF data"},
      {"lying-gif", lying_gif, "too many pixels: the image is 65535x65535"},
      {"truncated-bmp", FirstHalf(bmp), "corrupt or truncated BMP data"},
      {"corrupt-bmp", corrupt_bmp, "unsupported BMP header type"},
  };
  for (const Case& c : cases) {
    RawCall r = CallEncode(*t.stub, MakeRequest(c.name, {ToString(c.bytes)}));
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.name;
    EXPECT_TRUE(Contains(r.status.error_message(), "item 0: ")) << r.status.error_message();
    EXPECT_TRUE(Contains(r.status.error_message(), c.says)) << c.name << ": " << r.status.error_message();
  }
  ExpectStillServing(t);
}

TEST(ServerBadInputTest, MessageOverTheSizeLimitIsResourceExhausted) {
  TestServerOptions o;
  o.server.max_request_bytes = 64 << 10;
  TestServer t = StartTestServer(o);
  RawCall r = CallEncode(*t.stub, MakeRequest("huge", {std::string(100 << 10, 'x')}));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  ExpectStillServing(t);
}

// A log sink that keeps its lines.
struct LogLines {
  std::mutex mu;
  std::vector<std::string> lines;
  std::function<void(const std::string&)> Sink() {
    return [this](const std::string& line) {
      std::lock_guard<std::mutex> lock(mu);
      lines.push_back(line);
    };
  }
  bool Has(const std::string& part) {
    std::lock_guard<std::mutex> lock(mu);
    return std::any_of(lines.begin(), lines.end(), [&](const std::string& l) { return Contains(l, part); });
  }
};

std::uint64_t ErrorsWith(TestServer& t, StatusCode code) {
  const auto errors = t.server->Stats().rpc_errors;
  const auto it = errors.find(code);
  return it == errors.end() ? 0 : it->second;
}

TEST(ServerBadInputTest, RefusalForSizeIsCountedAndLogged) {
  LogLines log;
  TestServerOptions o;
  o.server.max_request_bytes = 64 << 10;
  o.server.log = log.Sink();
  TestServer t = StartTestServer(o);
  RawCall r = CallEncode(*t.stub, MakeRequest("huge", {std::string(100 << 10, 'x')}));
  ASSERT_EQ(r.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(WaitFor([&] { return ErrorsWith(t, StatusCode::kResourceExhausted) == 1; }));
  EXPECT_TRUE(WaitFor([&] { return log.Has("/epd.v1.Encoder/Encode"); }));
  EXPECT_TRUE(log.Has("RESOURCE_EXHAUSTED"));
}

// Sends `body` as the request message of /epd.v1.Encoder/Encode, bypassing
// the generated serializer.
grpc::Status CallEncodeWithRawBytes(TestServer& t, const std::string& body) {
  grpc::GenericStub stub(grpc::CreateChannel(t.target, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Slice slice(body);
  grpc::ByteBuffer request(&slice, 1);
  grpc::CompletionQueue cq;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call = stub.PrepareCall(&ctx, "/epd.v1.Encoder/Encode", &cq);
  void* tag;
  bool ok;
  call->StartCall(reinterpret_cast<void*>(1));
  cq.Next(&tag, &ok);
  call->Write(request, reinterpret_cast<void*>(2));
  cq.Next(&tag, &ok);
  call->WritesDone(reinterpret_cast<void*>(3));
  cq.Next(&tag, &ok);
  grpc::ByteBuffer reply;
  for (;;) {
    call->Read(&reply, reinterpret_cast<void*>(4));
    cq.Next(&tag, &ok);
    if (!ok) break;
  }
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

TEST(ServerBadInputTest, MalformedProtobufIsInvalidArgumentAndCounted) {
  LogLines log;
  TestServerOptions o;
  o.server.log = log.Sink();
  TestServer t = StartTestServer(o);
  // Field 1 (id, a string) declares 100 bytes but carries 2: not a message.
  const grpc::Status s = CallEncodeWithRawBytes(t, std::string("\x0a\x64xy", 4));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_TRUE(Contains(s.error_message(), "does not parse")) << s.error_message();
  EXPECT_TRUE(WaitFor([&] { return ErrorsWith(t, StatusCode::kInvalidArgument) == 1; }));
  EXPECT_EQ(ErrorsWith(t, StatusCode::kInternal), 0u);
  EXPECT_TRUE(WaitFor([&] { return log.Has("INVALID_ARGUMENT"); }));
  ExpectStillServing(t);
}

// Issue 27, fault 9: gRPC's health service finishes a Watch the client
// cancels with UNKNOWN ("OnCancel()"), which was counted and logged as a
// server error. A client's cancel is a cancel.
TEST(ServerBadInputTest, AClientEndingAHealthWatchIsCountedAsCancelledNotUnknown) {
  LogLines log;
  TestServerOptions o;
  o.server.log = log.Sink();
  TestServer t = StartTestServer(o);
  grpc::GenericStub stub(grpc::CreateChannel(t.target, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  grpc::CompletionQueue cq;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
      stub.PrepareCall(&ctx, "/grpc.health.v1.Health/Watch", &cq);
  void* tag;
  bool ok = false;
  auto step = [&](auto&& op) {
    op();
    return cq.Next(&tag, &ok) && ok;
  };
  grpc::Slice empty("");  // HealthCheckRequest{service: ""}: no bytes
  grpc::ByteBuffer request(&empty, 1), reply;
  ASSERT_TRUE(step([&] { call->StartCall(nullptr); }));
  ASSERT_TRUE(step([&] { call->Write(request, nullptr); }));
  ASSERT_TRUE(step([&] { call->WritesDone(nullptr); }));
  ASSERT_TRUE(step([&] { call->Read(&reply, nullptr); }));  // the first status: SERVING
  ctx.TryCancel();
  grpc::Status status;
  step([&] { call->Finish(&status, nullptr); });
  EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  EXPECT_TRUE(WaitFor([&] { return ErrorsWith(t, StatusCode::kCancelled) == 1; }));
  EXPECT_EQ(ErrorsWith(t, StatusCode::kUnknown), 0u);
  EXPECT_TRUE(WaitFor([&] { return log.Has("/grpc.health.v1.Health/Watch"); }));
  EXPECT_TRUE(log.Has("Watch from "));
  EXPECT_FALSE(log.Has("UNKNOWN"));
  EXPECT_TRUE(log.Has("CANCELLED"));
}

TEST(ServerBadInputTest, UncachedCallerKeyWithoutImageIsInvalidArgument) {
  TestServer t = StartTestServer();
  v1::EncodeRequest req;
  req.set_id("key-only");
  req.add_items()->set_caller_key("never-seen");
  RawCall r = CallEncode(*t.stub, req);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(r.status.error_message(), "not cached on this server")) << r.status.error_message();
  ExpectStillServing(t);
}

TEST(ServerBadInputTest, DuplicateRequestIdInFlightIsAlreadyExists) {
  TestServer t = StartTestServer();
  t.hold->store(true);
  const std::string img = Png(56, 56, 8);
  auto first = std::async(std::launch::async, [&] { return CallEncode(*t.stub, MakeRequest("same-id", {img})); });
  ASSERT_TRUE(WaitFor([&] { return t.server->Stats().worker.in_flight_requests == 1; }));
  RawCall second = CallEncode(*t.stub, MakeRequest("same-id", {Png(56, 56, 9)}));
  EXPECT_EQ(second.status.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_TRUE(Contains(second.status.error_message(), "same-id")) << second.status.error_message();
  t.hold->store(false);
  EXPECT_TRUE(first.get().status.ok());
  // The id is free again once the first request is done.
  EXPECT_TRUE(CallEncode(*t.stub, MakeRequest("same-id", {img})).status.ok());
}

TEST(ServerBadInputTest, QueuePastMaxQueueIsResourceExhausted) {
  TestServerOptions o;
  o.worker.max_pending_items = 1;
  TestServer t = StartTestServer(o);
  t.hold->store(true);
  auto queued =
      std::async(std::launch::async, [&] { return CallEncode(*t.stub, MakeRequest("q1", {Png(56, 56, 10)})); });
  ASSERT_TRUE(WaitFor([&] { return t.server->Stats().worker.pending_items == 1; }));
  RawCall over = CallEncode(*t.stub, MakeRequest("q2", {Png(56, 56, 11)}));
  EXPECT_EQ(over.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(Contains(over.status.error_message(), "limit is 1")) << over.status.error_message();
  t.hold->store(false);
  EXPECT_TRUE(queued.get().status.ok());
  ExpectStillServing(t);
}

TEST(ServerBadInputTest, MoreMissesThanMaxQueueIsInvalidArgumentNamingTheLimit) {
  TestServerOptions o;
  o.worker.max_pending_items = 1;
  TestServer t = StartTestServer(o);
  // An idle server: two new images can never fit a queue of one.
  RawCall r = CallEncode(*t.stub, MakeRequest("big", {Png(56, 56, 30), Png(56, 56, 31)}));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << r.status.error_message();
  EXPECT_TRUE(Contains(r.status.error_message(), "max_pending_items 1")) << r.status.error_message();
  ExpectStillServing(t);
}

bool AllPrintable(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c >= 0x20 && c <= 0x7e; });
}

TEST(ServerBadInputTest, AssignedRequestIdIsPrintableInErrorText) {
  TestServerOptions o;
  o.worker.max_pending_items = 1;
  TestServer t = StartTestServer(o);
  // No id: the server assigns one, and the worker's refusal quotes it.
  RawCall r = CallEncode(*t.stub, MakeRequest("", {Png(56, 56, 32), Png(56, 56, 33)}));
  EXPECT_FALSE(r.status.ok());
  EXPECT_TRUE(Contains(r.status.error_message(), "request 'epd-auto-")) << r.status.error_message();
  EXPECT_TRUE(AllPrintable(r.status.error_message())) << r.status.error_message();
}

TEST(ServerBadInputTest, RequestIdWithAControlCharacterIsInvalidArgument) {
  TestServer t = StartTestServer();
  RawCall r = CallEncode(*t.stub, MakeRequest(std::string("bad\x1f"
                                                          "id"),
                                              {Png(56, 56, 34)}));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(r.status.error_message(), "byte 0x1f at offset 3")) << r.status.error_message();
  EXPECT_TRUE(AllPrintable(r.status.error_message()));
  RawCall reserved = CallEncode(*t.stub, MakeRequest("epd-auto-1", {Png(56, 56, 34)}));
  EXPECT_EQ(reserved.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(reserved.status.error_message(), "reserved")) << reserved.status.error_message();
  EXPECT_EQ(t.tower_state->items_encoded(), 0);
}

TEST(ServerBadInputTest, TowerFailureFailsOnlyThatBatchsRequests) {
  TestServer t = StartTestServer();
  const std::string cached = Png(56, 56, 12);
  ASSERT_TRUE(CallEncode(*t.stub, MakeRequest("warm", {cached})).status.ok());

  t.hold->store(true);
  auto a = std::async(std::launch::async, [&] { return CallEncode(*t.stub, MakeRequest("a", {Png(56, 56, 13)})); });
  auto b = std::async(std::launch::async, [&] { return CallEncode(*t.stub, MakeRequest("b", {Png(56, 56, 14)})); });
  ASSERT_TRUE(WaitFor([&] { return t.server->Stats().worker.pending_items == 2; }));
  // Written before the release that lets the worker read it (seq_cst atomic).
  t.tower_state->fail_next = Internal("injected tower failure");
  // A hit is served while the batch waits.
  RawCall hit = CallEncode(*t.stub, MakeRequest("hit", {cached}));
  ASSERT_TRUE(hit.status.ok());
  EXPECT_EQ(hit.items[0].source(), v1::SOURCE_L1);
  t.hold->store(false);
  for (const RawCall& r : {a.get(), b.get()}) {
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INTERNAL);
    EXPECT_TRUE(Contains(r.status.error_message(), "injected tower failure")) << r.status.error_message();
  }
  // Stats are published after the loop iteration that delivered the failure.
  EXPECT_TRUE(WaitFor([&] { return t.server->Stats().worker.tower_failures == 1; }));
  ExpectStillServing(t);
}

}  // namespace
}  // namespace epd::testing
