// ServerOptions::Validate and CheckRequestShape: each rule refuses with
// kInvalidArgument (kResourceExhausted for a request's size) and a message
// naming the option, the item or the id; the defaults and a good request pass.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>

#include "epd/server/request_shape.h"
#include "epd/server/server.h"

namespace epd {
namespace {

using std::chrono::milliseconds;

struct OptionCase {
  const char* name;
  std::function<void(ServerOptions&)> spoil;
  const char* says;  // the message names this
};

TEST(ServerOptionsValidateTest, DefaultsPass) { EXPECT_TRUE(ServerOptions{}.Validate().ok()); }

TEST(ServerOptionsValidateTest, EachBadOptionIsNamed) {
  const OptionCase cases[] = {
      {"host without port", [](ServerOptions& o) { o.address = "localhost"; }, "server address 'localhost'"},
      {"empty unix path", [](ServerOptions& o) { o.extra_addresses = {"unix:"}; }, "server address 'unix:'"},
      {"negative arena", [](ServerOptions& o) { o.shm_arena_bytes = -1; }, "shm_arena_bytes must be >= 0"},
      {"zero lease", [](ServerOptions& o) { o.shm_lease = milliseconds(0); }, "shm_lease must be > 0 ms, got 0"},
      {"negative export", [](ServerOptions& o) { o.ipc_export_bytes = -5; }, "ipc_export_bytes must be >= 0"},
      {"negative ipc lease", [](ServerOptions& o) { o.ipc_lease = milliseconds(-1); }, "ipc_lease must be >= 0"},
      {"no sessions", [](ServerOptions& o) { o.shm_max_sessions = 0; }, "shm_max_sessions must be > 0, got 0"},
      {"no items", [](ServerOptions& o) { o.max_items_per_request = 0; }, "max_items_per_request must be > 0"},
      {"request bytes 0", [](ServerOptions& o) { o.max_request_bytes = 0; }, "max_request_bytes must be in"},
      {"request bytes 2 GiB",
       [](ServerOptions& o) {
         o.max_request_bytes = std::int64_t{2048} << 20;
         o.max_inflight_request_bytes = std::int64_t{4} << 30;
       },
       "max_request_bytes must be in (0, 2047 MiB], got 2147483648"},
      {"budget under a request", [](ServerOptions& o) { o.max_inflight_request_bytes = 1000; },
       "max_inflight_request_bytes (1000) must be >= max_request_bytes (67108864)"},
      {"negative admission wait", [](ServerOptions& o) { o.admission_wait = milliseconds(-1); },
       "admission_wait must be >= 0"},
      {"buffered 0", [](ServerOptions& o) { o.max_buffered_bytes = 0; }, "max_buffered_bytes must be > 0, got 0"},
      {"tenant share", [](ServerOptions& o) { o.max_buffered_bytes_per_tenant = -1; },
       "max_buffered_bytes_per_tenant must be >= 0"},
      {"reply bytes", [](ServerOptions& o) { o.max_reply_bytes_per_connection = 0; },
       "max_reply_bytes and max_reply_bytes_per_connection must be > 0, got 1073741824 and 0"},
      {"miss floor", [](ServerOptions& o) { o.miss_reply_floor = milliseconds(-3); },
       "miss_reply_floor must be >= 0 ms (0 = off), got -3"},
      {"write timeout", [](ServerOptions& o) { o.write_timeout = milliseconds(-1); }, "write_timeout must be >= 0"},
      {"keepalive", [](ServerOptions& o) { o.keepalive_timeout = milliseconds(-2); },
       "keepalive and keepalive_timeout must be >= 0 ms (0 = gRPC's default), got 60000 and -2"},
      {"streams", [](ServerOptions& o) { o.max_concurrent_streams = -1; }, "max_concurrent_streams must be >= 0"},
      {"rpc threads", [](ServerOptions& o) { o.max_rpc_threads = 1; }, "max_rpc_threads must be >= 2, got 1"},
  };
  for (const OptionCase& c : cases) {
    ServerOptions o;
    c.spoil(o);
    const Status s = o.Validate();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.name;
    EXPECT_NE(s.message().find(c.says), std::string::npos) << c.name << ": " << s.message();
  }
}

TEST(ServerOptionsValidateTest, HostPortAndUnixAddressesPass) {
  ServerOptions o;
  o.address = "[::1]:0";
  o.extra_addresses = {"unix:/tmp/epd.sock", "127.0.0.1:50051"};
  EXPECT_TRUE(o.Validate().ok()) << o.Validate().message();
}

RequestShape Images(int n) {
  RequestShape r;
  for (int i = 0; i < n; ++i) r.items.push_back(ItemShape{.image = true});
  return r;
}

TEST(RequestShapeTest, AGoodRequestPasses) {
  RequestShape r = Images(2);
  r.items.push_back(ItemShape{.caller_key = true});
  r.items.push_back(ItemShape{.video = true});
  r.items.push_back(ItemShape{.video_frames = true, .frame_count = 4});
  r.id = "client-7";
  r.message_bytes = 100;
  EXPECT_TRUE(CheckRequestShape(r, {.max_items = 5, .max_request_bytes = 100}).ok());
}

TEST(RequestShapeTest, ItemCountRulesHaveOneMessageEach) {
  const Status none = CheckRequestShape(Images(0), {});
  EXPECT_EQ(none.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(none.message(), "the request has no items; send at least one image");
  const Status many = CheckRequestShape(Images(3), {.max_items = 2});
  EXPECT_EQ(many.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(many.message(),
            "the request has 3 items; this server accepts at most 2 per request (split it, or raise "
            "--max-items-per-request)");
}

TEST(RequestShapeTest, ALargerMessageIsResourceExhaustedNamingBothSizes) {
  RequestShape r = Images(1);
  r.message_bytes = 1001;
  const Status s = CheckRequestShape(r, {.max_request_bytes = 1000});
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(),
            "the request is 1001 bytes; this server accepts at most 1000 (split it, or raise --max-request-mb)");
  r.message_bytes = -1;  // a front that bounds the size itself
  EXPECT_TRUE(CheckRequestShape(r, {.max_request_bytes = 1000}).ok());
}

TEST(RequestShapeTest, KindRulesNameTheItem) {
  const struct {
    ItemShape item;
    const char* says;
  } cases[] = {
      {ItemShape{}, "item 1 is empty"},
      {ItemShape{.image = true, .video = true}, "item 1 mixes kinds"},
      {ItemShape{.caller_key = true, .video_frames = true, .frame_count = 1}, "item 1 mixes kinds"},
      {ItemShape{.video = true, .video_frames = true, .frame_count = 1}, "item 1 mixes kinds"},
      {ItemShape{.video_frames = true}, "item 1 has `video_frames` without frames"},
  };
  for (const auto& c : cases) {
    RequestShape r = Images(1);
    r.items.push_back(c.item);
    const Status s = CheckRequestShape(r, {});
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.says;
    EXPECT_EQ(s.message().rfind(c.says, 0), 0u) << s.message();
  }
}

TEST(RequestShapeTest, RequestIdRules) {
  RequestShape r = Images(1);
  r.id = std::string(257, 'a');
  EXPECT_EQ(CheckRequestShape(r, {}).message(), "the request id is 257 bytes; at most 256 are allowed");
  r.id = "bad\nid";
  EXPECT_EQ(CheckRequestShape(r, {}).message(),
            "the request id has byte 0x0a at offset 3; ids must be printable ASCII");
  r.id = "epd-auto-1";
  EXPECT_NE(CheckRequestShape(r, {}).message().find("reserved for ids the server assigns"), std::string::npos);
  r.id = std::string(256, '~');
  EXPECT_TRUE(CheckRequestShape(r, {}).ok());
}

}  // namespace
}  // namespace epd
