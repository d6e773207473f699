// MediaFetcher against origins of our own on loopback (HttpEndpoint on
// 127.0.0.1 and 127.0.0.2): the SSRF refusals at the first hop and at a
// redirect, the domain list, the size and redirect limits, timeouts, and
// the errors of an unreachable or failing origin.
#include "epd/http/media_fetch.h"

#include <gtest/gtest.h>

#include <thread>

#include "epd/http/http_endpoint.h"
#include "http_test_util.h"

namespace epd {
namespace {

using std::chrono::milliseconds;

const std::string kBody = "\x89PNG not really, but bytes all the same";

// An origin on `ip`: /img, /big (2000 bytes), /missing (404), /slow (2 s),
// /to?u=<url> (302 to u), /loop (302 to itself).
std::unique_ptr<HttpEndpoint> Origin(const std::string& ip) {
  HttpEndpointOptions o;
  o.host = ip;
  auto redirect = [](const std::string& where) {
    HttpResponse r{302, "text/plain", "moved"};
    r.headers.emplace_back("Location", where);
    return r;
  };
  std::vector<HttpRoute> routes = {
      {"GET", "/img", false,
       [](const HttpRequest&) {
         return HttpResponse{200, "image/png", kBody};
       }},
      {"GET", "/big", false,
       [](const HttpRequest&) {
         return HttpResponse{200, "image/png", std::string(2000, 'x')};
       }},
      {"GET", "/missing", false,
       [](const HttpRequest&) {
         return HttpResponse{404, "text/plain", "no"};
       }},
      {"GET", "/slow", false,
       [](const HttpRequest&) {
         std::this_thread::sleep_for(std::chrono::seconds(2));
         return HttpResponse{200, "image/png", kBody};
       }},
      {"GET", "/loop", false, [redirect](const HttpRequest&) { return redirect("/loop"); }},
  };
  auto ep = HttpEndpoint::Start(o, routes);
  EXPECT_TRUE(ep.ok()) << ep.status().ToString();
  return ep.ok() ? std::move(*ep) : nullptr;
}

// /to/<port>/<path> on 127.0.0.1 -> http://127.0.0.2:<port>/<path>: an
// origin that sends its clients elsewhere.
std::unique_ptr<HttpEndpoint> Redirector(int target_port) {
  HttpEndpointOptions o;
  o.host = "127.0.0.1";
  HttpRoute to{"GET", "/to", false, [target_port](const HttpRequest&) {
                 HttpResponse r{302, "text/plain", "moved"};
                 r.headers.emplace_back("Location", "http://127.0.0.2:" + std::to_string(target_port) + "/img");
                 return r;
               }};
  auto ep = HttpEndpoint::Start(o, {to});
  EXPECT_TRUE(ep.ok()) << ep.status().ToString();
  return ep.ok() ? std::move(*ep) : nullptr;
}

std::unique_ptr<MediaFetcher> Fetcher(MediaFetchOptions o) {
  auto f = MediaFetcher::Create(std::move(o));
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  return f.ok() ? std::move(*f) : nullptr;
}

std::string Url(const HttpEndpoint& ep, const std::string& ip, const std::string& path) {
  return "http://" + ip + ":" + std::to_string(ep.port()) + path;
}

void ExpectRefused(const StatusOr<std::string>& got, StatusCode code, const std::string& part) {
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), code) << got.status().ToString();
  EXPECT_NE(got.status().message().find(part), std::string::npos) << got.status().message();
}

TEST(MediaFetchTest, LoopbackIsRefusedByDefaultAndFetchedWhenAllowed) {
  auto origin = Origin("127.0.0.1");
  const std::string url = Url(*origin, "127.0.0.1", "/img");
  ExpectRefused(Fetcher({})->Fetch(url), StatusCode::kPermissionDenied, "resolves to 127.0.0.1 (loopback)");
  MediaFetchOptions open;
  open.allow_private_addresses = true;
  StatusOr<std::string> got = Fetcher(open)->Fetch(url);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, kBody);
}

TEST(MediaFetchTest, ARedirectToAPrivateAddressIsRefusedAtThatHop) {
  auto target = Origin("127.0.0.2");
  auto redirector = Redirector(target->port());
  MediaFetchOptions o;
  o.allowed_networks = {"127.0.0.1/32"};  // the first hop's address only
  ExpectRefused(Fetcher(o)->Fetch(Url(*redirector, "127.0.0.1", "/to")), StatusCode::kPermissionDenied,
                "redirect 1 of");
  ExpectRefused(Fetcher(o)->Fetch(Url(*redirector, "127.0.0.1", "/to")), StatusCode::kPermissionDenied,
                "resolves to 127.0.0.2 (loopback)");
  o.allowed_networks.push_back("127.0.0.2/32");  // both hops: fetched
  StatusOr<std::string> got = Fetcher(o)->Fetch(Url(*redirector, "127.0.0.1", "/to"));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, kBody);
}

TEST(MediaFetchTest, TheDomainListAppliesToTheHostName) {
  auto origin = Origin("127.0.0.1");
  MediaFetchOptions o;
  o.allow_private_addresses = true;
  o.allowed_domains = {"LocalHost"};
  ExpectRefused(Fetcher(o)->Fetch(Url(*origin, "127.0.0.1", "/img")), StatusCode::kPermissionDenied,
                "the host '127.0.0.1' is not among the allowed media domains");
  StatusOr<std::string> got = Fetcher(o)->Fetch(Url(*origin, "localhost", "/img"));
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
  ExpectRefused(f->Fetch(Url(*origin, "127.0.0.1", "/big")), StatusCode::kResourceExhausted, "is over 1000 bytes");
  ExpectRefused(f->Fetch(Url(*origin, "127.0.0.1", "/missing")), StatusCode::kUnavailable, "answered HTTP 404");
  ExpectRefused(f->Fetch(Url(*origin, "127.0.0.1", "/loop")), StatusCode::kUnavailable, "redirects more than 2 times");
  ExpectRefused(f->Fetch(Url(*origin, "127.0.0.1", "/slow")), StatusCode::kUnavailable, "/slow");
  const int closed_port = origin->port();
  origin->Stop();
  ExpectRefused(f->Fetch("http://127.0.0.1:" + std::to_string(closed_port) + "/img"), StatusCode::kUnavailable,
                "Couldn't connect");
  ExpectRefused(f->Fetch("http://exa mple/"), StatusCode::kInvalidArgument, "is not a URL");
  auto bad = MediaFetcher::Create(MediaFetchOptions{.allowed_networks = {"10.0.0.0/40"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace epd
