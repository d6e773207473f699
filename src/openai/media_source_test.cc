// MediaSource against a loopback origin of our own (src/http/test_origin.h)
// and real files: ResolveAll's parallelism and its per-request bound, the
// sibling stop on a first failure, the client's cancel, the shared
// deadline, the charge, shutdown with fetches in flight; local files that
// are not regular (a FIFO never blocks); case-insensitive schemes; URLs
// that are not valid UTF-8.
#include "media_source.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "test_origin.h"

namespace epd::internal {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;
using testing_http::TestOrigin;
using Clock = std::chrono::steady_clock;

std::unique_ptr<MediaSource> Source(const std::string& local = "", int threads = 16) {
  MediaFetchOptions o;
  o.allow_private_addresses = true;
  o.max_bytes = 4 << 20;
  auto s = MediaSource::Create(o, local, threads);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(*s) : nullptr;
}

// The bytes, or the error as text (so a failure shows why).
std::string Bytes(const StatusOr<std::string>& s) { return s.ok() ? *s : "error: " + s.status().ToString(); }

// ResolveAll, waited for (a broken ResolveAll fails here after 60 s
// rather than hanging the test), with how many times `done` ran.
struct Resolved {
  ResolvedMedia media;
  int done_calls = 0;
  std::thread::id done_thread;
};
Resolved ResolveAllAndWait(MediaSource& src, std::vector<std::string> urls, ResolveOptions o) {
  auto got = std::make_shared<std::promise<Resolved>>();
  auto calls = std::make_shared<std::atomic<int>>(0);
  src.ResolveAll(std::move(urls), std::move(o), [got, calls](ResolvedMedia m) {
    if (++*calls == 1) got->set_value(Resolved{std::move(m), 1, std::this_thread::get_id()});
  });
  std::future<Resolved> f = got->get_future();
  if (f.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    ADD_FAILURE() << "done was not called within 60 s";
    return {};
  }
  Resolved r = f.get();
  std::this_thread::sleep_for(milliseconds(50));
  r.done_calls = calls->load();
  return r;
}

TEST(MediaSourceTest, ARequestsUrlsAreFetchedInParallelOffTheCallersThread) {
  TestOrigin origin;
  origin.Route("/gate", {.body = "img", .barrier = 4});  // answers once 4 requests are in at once
  auto src = Source();
  std::vector<std::string> urls(4, origin.Url("/gate"));
  const Resolved r = ResolveAllAndWait(*src, urls, ResolveOptions{.parallelism = 4});
  EXPECT_EQ(origin.max_active(), 4);
  EXPECT_EQ(r.done_calls, 1);
  EXPECT_NE(r.done_thread, std::this_thread::get_id());
  ASSERT_EQ(r.media.items.size(), 4u);
  for (const auto& item : r.media.items) EXPECT_EQ(Bytes(item), "img");
  EXPECT_FALSE(r.media.failed.has_value());
}

TEST(MediaSourceTest, ARequestNeverHasMoreThanItsBoundInFlight) {
  TestOrigin origin;
  origin.Route("/gate", {.body = "img", .barrier = 3});
  origin.Route("/slow", {.body = "img", .delay_ms = 100});
  auto src = Source();
  std::vector<std::string> urls(3, origin.Url("/gate"));
  urls.insert(urls.end(), 7, origin.Url("/slow"));
  const Resolved r = ResolveAllAndWait(*src, urls, ResolveOptions{.parallelism = 3});
  EXPECT_EQ(origin.max_active(), 3);  // 3 at once (the gate), never 4
  EXPECT_EQ(origin.requests(), 10);
  EXPECT_FALSE(r.media.failed.has_value());
}

TEST(MediaSourceTest, ThePoolBoundsTheThreadsOfEveryRequestTogether) {
  TestOrigin origin;
  origin.Route("/gate", {.body = "img", .barrier = 2});
  origin.Route("/slow", {.body = "img", .delay_ms = 100});
  auto src = Source("", /*threads=*/2);
  std::vector<std::string> urls = {origin.Url("/gate"), origin.Url("/gate"), origin.Url("/slow"), origin.Url("/slow")};
  auto first = std::async(std::launch::async, [&] { return ResolveAllAndWait(*src, urls, {}); });
  const Resolved second = ResolveAllAndWait(*src, {origin.Url("/slow"), origin.Url("/slow")}, {});
  EXPECT_FALSE(first.get().media.failed.has_value());
  EXPECT_FALSE(second.media.failed.has_value());
  EXPECT_EQ(origin.max_active(), 2);  // 2 threads for both requests: never 3
}

TEST(MediaSourceTest, TheFirstFailureStopsTheSiblingsInFlight) {
  TestOrigin origin;
  // The 404 goes out only once both stalls are in flight.
  origin.Route("/stall", {.body = "img", .barrier = 3, .barrier_group = "g", .delay_ms = 60000});
  origin.Route("/missing", {.status = 404, .body = "no", .barrier = 3, .barrier_group = "g"});
  auto src = Source();
  const std::vector<std::string> urls = {origin.Url("/stall"), origin.Url("/stall"), origin.Url("/missing"),
                                         origin.Url("/stall"), origin.Url("/stall")};
  const Resolved r = ResolveAllAndWait(*src, urls, ResolveOptions{.parallelism = 3});
  ASSERT_TRUE(r.media.failed.has_value());
  EXPECT_EQ(*r.media.failed, 2u);
  EXPECT_EQ(r.media.items[2].status().code(), StatusCode::kUnavailable);
  for (std::size_t i : {0u, 1u, 3u, 4u}) {
    EXPECT_EQ(r.media.items[i].status().code(), StatusCode::kCancelled) << i;
    EXPECT_EQ(r.media.items[i].status().message(), "not resolved: item 2 failed first") << i;
  }
  EXPECT_TRUE(origin.WaitFor([&] { return origin.closed_by_client() == 2; }));  // both stalls aborted
  EXPECT_EQ(origin.requests(), 3);                                              // items 3 and 4 never started
}

TEST(MediaSourceTest, TheClientsCancelEndsEveryFetchAndClosesTheirConnections) {
  TestOrigin origin;
  origin.Route("/endless", {.chunk = 4096, .gap_ms = 5, .endless = true});
  auto src = Source();
  auto cancel = std::make_shared<std::atomic<bool>>(false);
  std::atomic<std::int64_t> charged{0};
  ResolveOptions o{.cancel = cancel, .charge = [&](std::int64_t n) {
                     if ((charged += n) >= 200000) cancel->store(true);
                     return Status::Ok();
                   }};
  const Resolved r = ResolveAllAndWait(*src, std::vector<std::string>(3, origin.Url("/endless")), o);
  ASSERT_TRUE(r.media.failed.has_value());
  const Status& s = r.media.items[*r.media.failed].status();
  EXPECT_EQ(s.code(), StatusCode::kCancelled);
  EXPECT_NE(s.message().find("the client went away"), std::string::npos) << s.message();
  EXPECT_GE(origin.requests(), 1);
  EXPECT_TRUE(origin.WaitFor([&] { return origin.closed_by_client() == origin.requests(); }));
  EXPECT_EQ(r.media.charged_bytes, charged.load());
}

TEST(MediaSourceTest, OneDeadlineBoundsTheWholeRequest) {
  TestOrigin origin;
  origin.Route("/stall", {.body = "img", .delay_ms = 60000});
  auto src = Source();
  const auto start = Clock::now();
  const Resolved r = ResolveAllAndWait(*src, std::vector<std::string>(6, origin.Url("/stall")),
                                       ResolveOptions{.deadline = Clock::now() + milliseconds(500), .parallelism = 2});
  ASSERT_TRUE(r.media.failed.has_value());
  EXPECT_EQ(r.media.items[*r.media.failed].status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(30));
  EXPECT_LE(origin.requests(), 2);  // the deadline is shared: no later item gets a fresh one
}

TEST(MediaSourceTest, EveryKindOfSourceChargesItsBytes) {
  TestOrigin origin;
  const std::string body(100000, 'h');
  origin.Route("/img", {.body = body, .chunk = 8192});
  char tmpl[] = "/tmp/media_source_test.XXXXXX";
  const fs::path root = mkdtemp(tmpl);
  std::ofstream(root / "in.png") << "inside";
  auto src = Source(root.string());
  std::mutex mu;
  std::int64_t sum = 0;
  ResolveOptions o{.charge = [&](std::int64_t n) {
    std::lock_guard<std::mutex> lock(mu);
    sum += n;
    return Status::Ok();
  }};
  const Resolved r = ResolveAllAndWait(
      *src, {origin.Url("/img"), "data:image/png;base64,aGVsbG8=", "file://" + (root / "in.png").string()}, o);
  ASSERT_FALSE(r.media.failed.has_value()) << r.media.items[*r.media.failed].status().ToString();
  EXPECT_EQ(sum, static_cast<std::int64_t>(body.size() + 5 + 6));
  EXPECT_EQ(r.media.charged_bytes, sum);
  o.charge = [](std::int64_t) { return ResourceExhausted("over the in-flight budget"); };
  const Resolved refused = ResolveAllAndWait(*src, {"file://" + (root / "in.png").string()}, o);
  EXPECT_EQ(refused.media.items[0].status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(refused.media.charged_bytes, 0);
  fs::remove_all(root);
}

TEST(MediaSourceTest, DestroyingTheSourceEndsTheRequestsInFlight) {
  TestOrigin origin;
  origin.Route("/stall", {.body = "img", .delay_ms = 60000});
  auto src = Source();
  std::promise<ResolvedMedia> got;
  src->ResolveAll({origin.Url("/stall"), origin.Url("/stall")}, {},
                  [&](ResolvedMedia m) { got.set_value(std::move(m)); });
  ASSERT_TRUE(origin.WaitFor([&] { return origin.active() == 2; }));
  src.reset();  // returns once done has run
  std::future<ResolvedMedia> f = got.get_future();
  ASSERT_EQ(f.wait_for(milliseconds(0)), std::future_status::ready);
  const ResolvedMedia m = f.get();
  ASSERT_TRUE(m.failed.has_value());
  EXPECT_EQ(m.items[*m.failed].status().code(), StatusCode::kCancelled);
}

TEST(MediaSourceTest, AnEmptyRequestIsDoneAtOnce) {
  auto src = Source();
  const Resolved r = ResolveAllAndWait(*src, {}, {});
  EXPECT_EQ(r.done_calls, 1);
  EXPECT_TRUE(r.media.items.empty());
  EXPECT_FALSE(r.media.failed.has_value());
}

// A FIFO, a socket or a directory under the allowed path is refused by
// name, and never blocks: a regression fails here after 20 s, not hangs.
TEST(MediaSourceTest, ALocalFileThatIsNotRegularIsRefusedWithoutBlocking) {
  char tmpl[] = "/tmp/media_source_test.XXXXXX";
  const fs::path root = mkdtemp(tmpl);
  ASSERT_EQ(mkfifo((root / "pipe.png").c_str(), 0600), 0);
  fs::create_directory(root / "dir.png");
  std::ofstream(root / "in.png") << "inside";
  fs::create_directory(root / "sub");
  fs::create_symlink(root / "in.png", root / "sub" / "link.png");  // inside: followed by realpath, then none
  auto src = Source(root.string());
  const std::string fifo = "file://" + (root / "pipe.png").string();
  auto sync = std::async(std::launch::async, [&] { return src->Resolve(fifo); });
  if (sync.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    ADD_FAILURE() << "reading a FIFO blocked";
    close(open((root / "pipe.png").c_str(), O_WRONLY));  // releases the reader
  }
  const StatusOr<std::string> got = sync.get();
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(got.status().message().find("pipe.png is a FIFO (named pipe), not a regular file"), std::string::npos)
      << got.status().message();
  const Resolved r = ResolveAllAndWait(*src, {fifo, "file://" + (root / "dir.png").string()}, {});
  ASSERT_TRUE(r.media.failed.has_value());
  EXPECT_EQ(r.media.items[*r.media.failed].status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(Bytes(src->Resolve("file://" + (root / "sub" / "link.png").string())), "inside");
  const StatusOr<std::string> dir = src->Resolve("file://" + (root / "dir.png").string());
  EXPECT_NE(dir.status().message().find("is a directory"), std::string::npos) << dir.status().message();
  const int unix_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un sun{};
  sun.sun_family = AF_UNIX;
  const std::string sock = (root / "sock.png").string();
  ASSERT_LT(sock.size(), sizeof(sun.sun_path));
  std::copy(sock.begin(), sock.end(), sun.sun_path);
  ASSERT_EQ(bind(unix_fd, reinterpret_cast<sockaddr*>(&sun), sizeof(sun)), 0);
  const StatusOr<std::string> on_socket = src->Resolve("file://" + sock);
  EXPECT_EQ(on_socket.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(on_socket.status().message().find("sock.png is a socket"), std::string::npos)
      << on_socket.status().message();
  close(unix_fd);
  fs::remove_all(root);
}

TEST(MediaSourceTest, SchemesAreCaseInsensitive) {
  TestOrigin origin;
  origin.Route("/img", {.body = "img"});
  char tmpl[] = "/tmp/media_source_test.XXXXXX";
  const fs::path root = mkdtemp(tmpl);
  std::ofstream(root / "in.png") << "inside";
  auto src = Source(root.string());
  EXPECT_EQ(Bytes(src->Resolve("HTTP://127.0.0.1:" + std::to_string(origin.port()) + "/img")), "img");
  EXPECT_EQ(Bytes(src->Resolve("Data:image/png;BASE64,aGk=")), "hi");
  EXPECT_EQ(Bytes(src->Resolve("DATA:;base64,aGk=")), "hi");
  EXPECT_EQ(Bytes(src->Resolve("FILE://" + (root / "in.png").string())), "inside");
  EXPECT_EQ(Bytes(src->Resolve("File://LOCALHOST" + (root / "in.png").string())), "inside");
  fs::remove_all(root);
}

TEST(MediaSourceTest, UrlsThatAreNotValidUtf8GetAClearErrorInValidUtf8) {
  char tmpl[] = "/tmp/media_source_test.XXXXXX";
  const fs::path root = mkdtemp(tmpl);
  auto src = Source(root.string());
  const std::string cases[] = {
      "http://example.com/\xE2\x82",                                    // cut mid-character
      "data:image/png;base64,\xFF\xFE",                                 // invalid bytes
      "gopher://" + std::string(52, 'a') + "\xE2\x82\xAC\xE2\x82\xAC",  // the 64-byte cut falls mid-character
      "file://" + root.string() + "/%FF%FE.png",                        // percent-decoded into invalid UTF-8
  };
  for (const std::string& url : cases) {
    const StatusOr<std::string> got = src->Resolve(url);
    ASSERT_FALSE(got.ok()) << url;
    EXPECT_NE(got.status().code(), StatusCode::kInternal) << url;
    EXPECT_EQ(FirstInvalidUtf8(got.status().message()), std::string::npos) << got.status().message();
  }
  EXPECT_EQ(src->Resolve(cases[0]).status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(src->Resolve(cases[0]).status().message().find("is not valid UTF-8"), std::string::npos);
  fs::remove_all(root);
}

}  // namespace
}  // namespace epd::internal
