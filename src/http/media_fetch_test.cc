// MediaFetcher against origins of our own on loopback (TestOrigin on
// 127.0.0.1 and 127.0.0.2): the SSRF refusals at the first hop and at a
// redirect, the domain list, the size and redirect limits, timeouts, the
// errors of an unreachable or failing origin; and what a FetchControl adds:
// the byte charge, the cancel flag and the shared deadline.
#include "epd/http/media_fetch.h"

#include <gtest/gtest.h>

#include <thread>

#include "test_origin.h"

namespace epd {
namespace {

using std::chrono::milliseconds;
using testing_http::OriginRoute;
using testing_http::TestOrigin;
using Clock = std::chrono::steady_clock;

const std::string kBody = "\x89PNG not really, but bytes all the same";

OriginRoute Redirect(const std::string& where) { return OriginRoute{.status = 302, .headers = {{"Location", where}}}; }

// An origin on `ip`: /img, /big (2000 bytes), /missing (404), /slow (2 s),
// /loop (302 to itself).
std::unique_ptr<TestOrigin> Origin(const std::string& ip) {
  auto o = std::make_unique<TestOrigin>(ip);
  o->Route("/img", {.body = kBody});
  o->Route("/big", {.body = std::string(2000, 'x')});
  o->Route("/missing", {.status = 404, .body = "no"});
  o->Route("/slow", {.body = kBody, .delay_ms = 2000});
  o->Route("/loop", Redirect("/loop"));
  return o;
}

std::unique_ptr<MediaFetcher> Fetcher(MediaFetchOptions o) {
  auto f = MediaFetcher::Create(std::move(o));
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  return f.ok() ? std::move(*f) : nullptr;
}

std::unique_ptr<MediaFetcher> Open() { return Fetcher(MediaFetchOptions{.allow_private_addresses = true}); }

void ExpectRefused(const StatusOr<std::string>& got, StatusCode code, const std::string& part) {
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), code) << got.status().ToString();
  EXPECT_NE(got.status().message().find(part), std::string::npos) << got.status().message();
}

TEST(MediaFetchTest, LoopbackIsRefusedByDefaultAndFetchedWhenAllowed) {
  auto origin = Origin("127.0.0.1");
  const std::string url = origin->Url("/img");
  ExpectRefused(Fetcher({})->Fetch(url), StatusCode::kPermissionDenied, "resolves to 127.0.0.1 (loopback)");
  StatusOr<std::string> got = Open()->Fetch(url);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, kBody);
}

TEST(MediaFetchTest, ARedirectToAPrivateAddressIsRefusedAtThatHop) {
  auto target = Origin("127.0.0.2");
  TestOrigin redirector("127.0.0.1");
  redirector.Route("/to", Redirect(target->Url("/img")));
  MediaFetchOptions o;
  o.allowed_networks = {"127.0.0.1/32"};  // the first hop's address only
  ExpectRefused(Fetcher(o)->Fetch(redirector.Url("/to")), StatusCode::kPermissionDenied, "redirect 1 of");
  ExpectRefused(Fetcher(o)->Fetch(redirector.Url("/to")), StatusCode::kPermissionDenied,
                "resolves to 127.0.0.2 (loopback)");
  o.allowed_networks.push_back("127.0.0.2/32");  // both hops: fetched
  StatusOr<std::string> got = Fetcher(o)->Fetch(redirector.Url("/to"));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, kBody);
}

TEST(MediaFetchTest, TheDomainListAppliesToTheHostName) {
  auto origin = Origin("127.0.0.1");
  MediaFetchOptions o;
  o.allow_private_addresses = true;
  o.allowed_domains = {"LocalHost"};
  ExpectRefused(Fetcher(o)->Fetch(origin->Url("/img")), StatusCode::kPermissionDenied,
                "the host '127.0.0.1' is not among the allowed media domains");
  StatusOr<std::string> got = Fetcher(o)->Fetch("http://localhost:" + std::to_string(origin->port()) + "/img");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, kBody);
  ExpectRefused(Fetcher(o)->Fetch("ftp://localhost/img"), StatusCode::kPermissionDenied, "is not http or https");
}

TEST(MediaFetchTest, LimitsAndFailuresEachHaveTheirCode) {
  auto origin = Origin("127.0.0.1");
  MediaFetchOptions o;
  o.allow_private_addresses = true;
  o.max_bytes = 1000;
  o.max_redirects = 2;
  o.timeout = milliseconds(500);
  auto f = Fetcher(o);
  ExpectRefused(f->Fetch(origin->Url("/big")), StatusCode::kResourceExhausted, "is over 1000 bytes");
  ExpectRefused(f->Fetch(origin->Url("/missing")), StatusCode::kUnavailable, "answered HTTP 404");
  ExpectRefused(f->Fetch(origin->Url("/loop")), StatusCode::kUnavailable, "redirects more than 2 times");
  ExpectRefused(f->Fetch(origin->Url("/slow")), StatusCode::kUnavailable, "/slow");
  const std::string gone = origin->Url("/img");
  origin.reset();
  ExpectRefused(f->Fetch(gone), StatusCode::kUnavailable, "Couldn't connect");
  ExpectRefused(f->Fetch("http://exa mple/"), StatusCode::kInvalidArgument, "is not a URL");
  auto bad = MediaFetcher::Create(MediaFetchOptions{.allowed_networks = {"10.0.0.0/40"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
}

TEST(MediaFetchTest, UpperCaseSchemesAreHttp) {
  auto origin = Origin("127.0.0.1");
  for (const std::string scheme : {"HTTP", "Http", "hTtP"}) {
    StatusOr<std::string> got = Open()->Fetch(scheme + "://127.0.0.1:" + std::to_string(origin->port()) + "/img");
    ASSERT_TRUE(got.ok()) << scheme << ": " << got.status().ToString();
    EXPECT_EQ(*got, kBody);
  }
  ExpectRefused(Open()->Fetch("FTP://127.0.0.1/img"), StatusCode::kPermissionDenied, "is not http or https");
}

// Every byte of a body is charged as it arrives, and nothing else is.
TEST(MediaFetchTest, TheChargeSeesEveryBodyByteAndOnlyThose) {
  TestOrigin origin;
  const std::string body(300000, 'b');
  origin.Route("/big", {.body = body, .chunk = 16384});
  origin.Route("/to", Redirect("/big"));
  origin.Route("/missing", {.status = 404, .body = std::string(5000, 'n')});
  std::int64_t charged = 0;
  int calls = 0;
  FetchControl c{.charge = [&](std::int64_t n) {
    EXPECT_GT(n, 0);
    charged += n;
    ++calls;
    return Status::Ok();
  }};
  StatusOr<std::string> got = Open()->Fetch(origin.Url("/to"), c);  // a redirect's body is not charged
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, body);
  EXPECT_EQ(charged, static_cast<std::int64_t>(body.size()));
  EXPECT_GT(calls, 1);  // as the bytes arrive, not once at the end
  charged = 0;
  ExpectRefused(Open()->Fetch(origin.Url("/missing"), c), StatusCode::kUnavailable, "answered HTTP 404");
  EXPECT_EQ(charged, 0);  // an error page is neither read nor charged
}

TEST(MediaFetchTest, ARefusedChargeAbortsTheFetchWithItsStatus) {
  TestOrigin origin;
  origin.Route("/big", {.body = std::string(1 << 20, 'b'), .chunk = 16384, .gap_ms = 1});
  std::int64_t charged = 0;
  FetchControl c{.charge = [&](std::int64_t n) {
    if (charged + n > 100000) return ResourceExhausted("the in-flight budget is spent");
    charged += n;
    return Status::Ok();
  }};
  ExpectRefused(Open()->Fetch(origin.Url("/big"), c), StatusCode::kResourceExhausted, "the in-flight budget is spent");
  EXPECT_LE(charged, 100000);
  EXPECT_TRUE(origin.WaitFor([&] { return origin.closed_by_client() == 1; }));  // the transfer stopped
}

// A cancel mid-transfer aborts it: the origin sees the connection closed.
TEST(MediaFetchTest, CancelMidTransferClosesTheConnection) {
  TestOrigin origin;
  origin.Route("/endless", {.chunk = 4096, .gap_ms = 5, .endless = true});
  auto cancel = std::make_shared<std::atomic<bool>>(false);
  std::int64_t charged = 0;
  FetchControl c{.cancel = cancel, .charge = [&](std::int64_t n) {
                   charged += n;
                   if (charged >= 65536) cancel->store(true);  // the client goes mid-body
                   return Status::Ok();
                 }};
  ExpectRefused(Open()->Fetch(origin.Url("/endless"), c), StatusCode::kCancelled, "the client went away");
  EXPECT_TRUE(origin.WaitFor([&] { return origin.closed_by_client() == 1; }));
}

// While no byte flows (the origin thinks), a cancel still ends the fetch,
// through curl's progress callback.
TEST(MediaFetchTest, CancelWhileTheOriginIsSilentEndsTheFetch) {
  TestOrigin origin;
  origin.Route("/stall", {.body = kBody, .delay_ms = 60000});
  auto cancel = std::make_shared<std::atomic<bool>>(false);
  std::thread client_goes([&] {
    origin.WaitFor([&] { return origin.active() == 1; });
    cancel->store(true);
  });
  const auto start = Clock::now();
  ExpectRefused(Open()->Fetch(origin.Url("/stall"), FetchControl{.cancel = cancel}), StatusCode::kCancelled,
                "the client went away");
  client_goes.join();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(30));  // not the origin's 60 s
  EXPECT_TRUE(origin.WaitFor([&] { return origin.closed_by_client() == 1; }));
}

TEST(MediaFetchTest, TheRequestDeadlineEndsAFetchBeforeItsOwnTimeout) {
  TestOrigin origin;
  origin.Route("/stall", {.body = kBody, .delay_ms = 60000});
  auto f = Open();  // its own timeout: 10 s
  ExpectRefused(f->Fetch(origin.Url("/stall"), FetchControl{.deadline = Clock::now() + milliseconds(300)}),
                StatusCode::kDeadlineExceeded, "the request's fetch deadline passed");
  EXPECT_TRUE(origin.WaitFor([&] { return origin.closed_by_client() == origin.requests(); }));
}

TEST(MediaFetchTest, AFetchPastItsDeadlineNeverConnects) {
  TestOrigin origin;
  origin.Route("/img", {.body = kBody});
  ExpectRefused(Open()->Fetch(origin.Url("/img"), FetchControl{.deadline = Clock::now() - milliseconds(1)}),
                StatusCode::kDeadlineExceeded, "/img");
  auto cancel = std::make_shared<std::atomic<bool>>(true);
  ExpectRefused(Open()->Fetch(origin.Url("/img"), FetchControl{.cancel = cancel}), StatusCode::kCancelled,
                "the client went away");
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_EQ(origin.requests(), 0);
}

TEST(MediaFetchTest, InvalidUtf8UrlsAreRefusedWithValidUtf8Messages) {
  const std::string cut = "http://example.com/caf\xC3";  // cut mid-character
  StatusOr<std::string> got = Open()->Fetch(cut);
  ExpectRefused(got, StatusCode::kInvalidArgument, "is not valid UTF-8 (byte 22)");
  EXPECT_EQ(FirstInvalidUtf8(got.status().message()), std::string::npos);
  EXPECT_NE(got.status().message().find("caf\\xC3"), std::string::npos) << got.status().message();
  got = Open()->Fetch("http://example.com/\xFF\xFE");
  ExpectRefused(got, StatusCode::kInvalidArgument, "\\xFF\\xFE");
}

TEST(MediaFetchTest, MessagesQuoteUrlsAsValidUtf8CutOnCharacterBoundaries) {
  EXPECT_EQ(MediaUrlForMessage("http://a/caf\xC3\xA9"), "http://a/caf\xC3\xA9");
  EXPECT_EQ(MediaUrlForMessage("a\xC3"), "a\\xC3");
  EXPECT_EQ(MediaUrlForMessage("a\xED\xA0\x80"), "a\\xED\\xA0\\x80");  // a surrogate
  EXPECT_EQ(MediaUrlForMessage("a\xC0\xAF"), "a\\xC0\\xAF");           // overlong '/'
  EXPECT_EQ(MediaUrlForMessage("a\nb"), "a\\x0Ab");
  EXPECT_EQ(MediaUrlForMessage("ab\xE2\x82\xAC", 4), "ab...");  // never half a euro sign
  EXPECT_EQ(MediaUrlForMessage(std::string(300, 'x')), std::string(256, 'x') + "...");
  EXPECT_EQ(FirstInvalidUtf8("ok \xF0\x9F\x98\x80"), std::string::npos);
  EXPECT_EQ(FirstInvalidUtf8("ok \xF0\x9F\x98"), 3u);
  EXPECT_EQ(FirstInvalidUtf8("\xF4\x90\x80\x80"), 0u);  // past U+10FFFF
}

}  // namespace
}  // namespace epd
