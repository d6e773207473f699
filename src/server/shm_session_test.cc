// Lease sessions (docs/SHM.md, "Crashed clients"): ShmArena owners on an
// injected clock, then the Session RPC end to end through a real in-process
// EncodeServer, the raw stub and the client library. Every expected count
// follows from the calls the test makes.
#include <gtest/gtest.h>

#include <cctype>
#include <set>
#include <thread>

#include "epd/client/client.h"
#include "shm_arena.h"
#include "test_server.h"
#include "worker_test_util.h"

namespace epd::testing {
namespace {

using internal::ShmArena;
using std::chrono::milliseconds;

struct ManualClock {
  ShmArena::Clock::time_point now{};
};

std::unique_ptr<ShmArena> MakeArena(std::int64_t bytes, milliseconds lease, ManualClock* clock) {
  StatusOr<std::unique_ptr<ShmArena>> a = ShmArena::Create(bytes, lease, [clock] { return clock->now; });
  EXPECT_TRUE(a.ok()) << a.status().ToString();
  return a.ok() ? std::move(*a) : nullptr;
}

TEST(ShmArenaOwnerTest, ReleaseOwnerEndsOnlyItsOwnLiveLeasesAndRetiresTheOwner) {
  ManualClock clock;
  auto arena = MakeArena(1024, milliseconds(1000), &clock);
  ASSERT_NE(arena, nullptr);
  const std::uint64_t mine = arena->OpenOwner(), other = arena->OpenOwner();
  EXPECT_NE(mine, 0u);
  EXPECT_NE(mine, other);
  auto a = arena->Acquire("", 256), b = arena->Acquire("", 256), c = arena->Acquire("", 256),
       d = arena->Acquire("", 256);
  ASSERT_TRUE(a && b && c && d);
  EXPECT_FALSE(arena->Acquire("", 64).has_value());  // 4 x 256 = the whole arena
  EXPECT_TRUE(arena->Adopt(a->generation, mine));
  EXPECT_TRUE(arena->Adopt(b->generation, mine));
  EXPECT_TRUE(arena->Adopt(c->generation, mine));
  EXPECT_TRUE(arena->Adopt(d->generation, other));
  EXPECT_FALSE(arena->Adopt(a->generation, other));  // one owner per lease
  EXPECT_FALSE(arena->Adopt(a->generation, 999));    // never opened
  // b is released by hand first: the owner's release does not count it again.
  ASSERT_TRUE(arena->Release(b->offset, b->generation).ok());

  EXPECT_EQ(arena->ReleaseOwner(mine), 2u);  // a and c
  ShmStats s = arena->Stats();
  EXPECT_EQ(s.leases, 1);  // d, the other owner's
  EXPECT_EQ(s.leased_bytes, 256);
  EXPECT_EQ(s.released, 1u);
  EXPECT_EQ(s.session_reclaimed, 2u);
  EXPECT_EQ(s.refused_releases, 0u);
  // a's and c's leases are gone: releasing them now is refused.
  EXPECT_EQ(arena->Release(a->offset, a->generation).code(), StatusCode::kFailedPrecondition);
  // The owner is retired: repeating is harmless, adopting under it fails.
  EXPECT_EQ(arena->ReleaseOwner(mine), 0u);
  auto e = arena->Acquire("", 512);  // a, b and c coalesced back into one free block
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->offset, 0u);
  EXPECT_FALSE(arena->Adopt(e->generation, mine));
  EXPECT_EQ(arena->Stats().session_reclaimed, 2u);
}

TEST(ShmArenaOwnerTest, AnOwnedLeaseStillExpiresAtItsDeadline) {
  ManualClock clock;
  auto arena = MakeArena(1024, milliseconds(100), &clock);
  ASSERT_NE(arena, nullptr);
  const std::uint64_t owner = arena->OpenOwner();
  auto a = arena->Acquire("", 100);
  ASSERT_TRUE(a.has_value());
  EXPECT_TRUE(arena->Adopt(a->generation, owner));
  clock.now += milliseconds(100);
  ShmStats s = arena->Stats();
  EXPECT_EQ(s.leases, 0);
  EXPECT_EQ(s.expired, 1u);
  // Expiry took it out of the owner's set: nothing left to reclaim.
  EXPECT_EQ(arena->ReleaseOwner(owner), 0u);
  EXPECT_EQ(arena->Stats().session_reclaimed, 0u);
  // And an expired lease cannot be adopted.
  const std::uint64_t late = arena->OpenOwner();
  EXPECT_FALSE(arena->Adopt(a->generation, late));
}

TEST(ShmArenaOwnerTest, ASharedSpanStaysLeasedWhileAnotherLeaseHoldsIt) {
  ManualClock clock;
  auto arena = MakeArena(1024, milliseconds(1000), &clock);
  ASSERT_NE(arena, nullptr);
  const std::uint64_t owner = arena->OpenOwner();
  auto first = arena->Acquire("key", 128);
  ASSERT_TRUE(first.has_value());
  arena->Publish(*first);
  auto second = arena->Acquire("key", 128);  // same span, a second lease, no owner
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->offset, first->offset);
  EXPECT_TRUE(arena->Adopt(first->generation, owner));
  EXPECT_EQ(arena->ReleaseOwner(owner), 1u);
  ShmStats s = arena->Stats();
  EXPECT_EQ(s.leases, 1);
  EXPECT_EQ(s.leased_bytes, 128);  // still leased by `second`
  EXPECT_TRUE(arena->Release(second->offset, second->generation).ok());
}

// --- The Session RPC ----------------------------------------------------------

using SessionStream = grpc::ClientReaderWriter<v1::SessionMessage, v1::SessionEvent>;

// An open Session call on a raw stub.
struct RawSession {
  grpc::ClientContext ctx;
  std::unique_ptr<SessionStream> stream;
  v1::SessionEvent first;
  bool named = false;  // the first event came

  explicit RawSession(v1::Encoder::Stub& stub) {
    stream = stub.Session(&ctx);
    named = stream->Read(&first);
  }
  // Reads to the end and returns the call's status.
  grpc::Status Drain() {
    v1::SessionEvent e;
    while (stream->Read(&e)) {
    }
    return stream->Finish();
  }
};

bool IsSessionId(const std::string& id) {
  if (id.size() != 32) return false;
  for (char c : id) {
    if (!std::isxdigit(static_cast<unsigned char>(c)) || std::isupper(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

ClientItem Item(std::string image) {
  ClientItem c;
  c.image = std::move(image);
  return c;
}

v1::EncodeRequest ShmRequest(const std::string& id, const std::vector<std::string>& images) {
  v1::EncodeRequest req = MakeRequest(id, images);
  req.set_delivery(v1::DELIVERY_SHM);
  return req;
}

// A lease time no test waits out: only a session can end these leases.
constexpr milliseconds kLongLease{600000};

TestServer StartSessionServer(std::int64_t max_sessions = 1024) {
  TestServerOptions o;
  o.server.shm_arena_bytes = 8 << 20;
  o.server.shm_lease = kLongLease;
  o.server.shm_max_sessions = max_sessions;
  return StartTestServer(o);
}

TEST(ShmSessionTest, HalfClosingTheStreamReleasesTheSessionsLeasesOnly) {
  TestServer t = StartSessionServer();
  RawSession session(*t.stub);
  ASSERT_TRUE(session.named);
  EXPECT_TRUE(IsSessionId(session.first.session_id())) << session.first.session_id();
  EXPECT_EQ(session.first.lease_ms(), kLongLease.count());
  EXPECT_EQ(t.server->Stats().shm.sessions, 1);

  RawCall in = CallEncodeIn(*t.stub, ShmRequest("in", {Png(56, 56, 1), Png(84, 56, 2)}), session.first.session_id());
  ASSERT_TRUE(in.status.ok()) << in.status.error_message();
  ASSERT_EQ(in.items.size(), 2u);
  for (const v1::EncodedItem& item : in.items) {
    ASSERT_TRUE(item.has_shm());
    EXPECT_TRUE(item.shm().in_session());
  }
  RawCall outside = CallEncodeIn(*t.stub, ShmRequest("out", {Png(56, 84, 3)}), "");
  ASSERT_TRUE(outside.status.ok());
  EXPECT_FALSE(outside.items[0].shm().in_session());
  EXPECT_EQ(t.server->Stats().shm.leases, 3);

  ASSERT_TRUE(session.stream->WritesDone());
  EXPECT_TRUE(session.Drain().ok());  // the server finishes the call after releasing
  const ShmStats s = t.server->Stats().shm;
  EXPECT_EQ(s.leases, 1);  // the call outside the session
  EXPECT_EQ(s.session_reclaimed, 2u);
  EXPECT_EQ(s.released, 0u);
  EXPECT_EQ(s.expired, 0u);
  EXPECT_EQ(s.sessions, 0);
  EXPECT_EQ(s.sessions_opened, 1u);
}

TEST(ShmSessionTest, CancellingTheStreamReleasesItsLeases) {
  TestServer t = StartSessionServer();
  auto session = std::make_unique<RawSession>(*t.stub);
  ASSERT_TRUE(session->named);
  ASSERT_TRUE(CallEncodeIn(*t.stub, ShmRequest("a", {Png(56, 56, 4), Png(56, 56, 5)}), session->first.session_id())
                  .status.ok());
  EXPECT_EQ(t.server->Stats().shm.leases, 2);
  session->ctx.TryCancel();
  EXPECT_EQ(session->Drain().error_code(), grpc::StatusCode::CANCELLED);
  // The server learns of the cancellation asynchronously.
  ASSERT_TRUE(WaitFor([&] {
    const ShmStats s = t.server->Stats().shm;
    return s.leases == 0 && s.sessions == 0;
  }));
  EXPECT_EQ(t.server->Stats().shm.session_reclaimed, 2u);
}

TEST(ShmSessionTest, AnUnknownSessionIdIsServedOutsideAnySessionAndCounted) {
  TestServer t = StartSessionServer();
  RawSession live(*t.stub);  // a live session the made-up id must not reach
  ASSERT_TRUE(live.named);
  const std::string made_up(32, 'a');
  ASSERT_NE(made_up, live.first.session_id());
  RawCall call = CallEncodeIn(*t.stub, ShmRequest("u", {Png(56, 56, 6)}), made_up);
  ASSERT_TRUE(call.status.ok()) << call.status.error_message();
  ASSERT_TRUE(call.items[0].has_shm());
  EXPECT_FALSE(call.items[0].shm().in_session());
  EXPECT_EQ(t.server->Stats().shm.session_unknown, 1u);
  // Ending the live session leaves that lease alone.
  ASSERT_TRUE(live.stream->WritesDone());
  EXPECT_TRUE(live.Drain().ok());
  const ShmStats s = t.server->Stats().shm;
  EXPECT_EQ(s.leases, 1);
  EXPECT_EQ(s.session_reclaimed, 0u);

  // An ended session's id is unknown from then on.
  RawCall late = CallEncodeIn(*t.stub, ShmRequest("late", {Png(56, 56, 7)}), live.first.session_id());
  ASSERT_TRUE(late.status.ok());
  EXPECT_FALSE(late.items[0].shm().in_session());
  EXPECT_EQ(t.server->Stats().shm.session_unknown, 2u);
}

TEST(ShmSessionTest, AMalformedSessionHeaderIsInvalidArgument) {
  TestServer t = StartSessionServer();
  for (const std::string& bad : {std::string("xyz"), std::string(32, 'g'), std::string(33, 'a')}) {
    RawCall call = CallEncodeIn(*t.stub, ShmRequest("m", {Png(56, 56, 8)}), bad);
    EXPECT_EQ(call.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << bad;
    EXPECT_NE(call.status.error_message().find("x-epd-session"), std::string::npos) << call.status.error_message();
    EXPECT_TRUE(call.items.empty());
  }
  EXPECT_EQ(t.server->Stats().shm.leases, 0);
}

TEST(ShmSessionTest, SessionsPastTheCapAreRefusedNamingIt) {
  TestServer t = StartSessionServer(/*max_sessions=*/2);
  RawSession a(*t.stub), b(*t.stub);
  ASSERT_TRUE(a.named && b.named);
  EXPECT_NE(a.first.session_id(), b.first.session_id());
  RawSession c(*t.stub);
  EXPECT_FALSE(c.named);
  const grpc::Status refused = c.Drain();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(refused.error_message().find("cap (2, --shm-max-sessions)"), std::string::npos) << refused.error_message();
  EXPECT_EQ(t.server->Stats().shm.sessions_refused, 1u);
  // Room again once one ends.
  ASSERT_TRUE(a.stream->WritesDone());
  EXPECT_TRUE(a.Drain().ok());
  RawSession d(*t.stub);
  EXPECT_TRUE(d.named);
  const ShmStats s = t.server->Stats().shm;
  EXPECT_EQ(s.sessions, 2);
  EXPECT_EQ(s.sessions_opened, 3u);
}

TEST(ShmSessionTest, ServerWithoutAnArenaRefusesSessions) {
  TestServer t = StartTestServer();
  RawSession s(*t.stub);
  EXPECT_FALSE(s.named);
  const grpc::Status st = s.Drain();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(st.error_message().find("--shm-arena-mb"), std::string::npos) << st.error_message();
}

TEST(ShmSessionTest, ABearerTokenServerRefusesASessionWithoutIt) {
  TestServerOptions o;
  o.server.shm_arena_bytes = 1 << 20;
  o.server.auth_token = "s3cret";
  TestServer t = StartTestServer(o);
  RawSession s(*t.stub);
  EXPECT_FALSE(s.named);
  EXPECT_EQ(s.Drain().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(t.server->Stats().shm.sessions_opened, 0u);
}

TEST(ShmSessionTest, ShutdownEndsOpenSessionsAsUnavailable) {
  TestServer t = StartSessionServer();
  RawSession s(*t.stub);
  ASSERT_TRUE(s.named);
  ASSERT_TRUE(CallEncodeIn(*t.stub, ShmRequest("s", {Png(56, 56, 9)}), s.first.session_id()).status.ok());
  // A long grace: the session must be ended by the server, not outlast it.
  std::thread stop([&] { t.server->Shutdown(std::chrono::seconds(60)); });
  const grpc::Status st = s.Drain();
  stop.join();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(st.error_message().find("shutting down"), std::string::npos) << st.error_message();
  const ShmStats stats = t.server->Stats().shm;
  EXPECT_EQ(stats.leases, 0);
  EXPECT_EQ(stats.session_reclaimed, 1u);
}

// --- The client library -----------------------------------------------------

TEST(ShmSessionTest, ClientHoldsItsLeasesInASessionThatItsDestructionEnds) {
  TestServer t = StartSessionServer();
  ClientOptions co{.target = t.target};
  co.delivery = Delivery::kShm;
  auto client = EncodeClient::Connect(co);
  ASSERT_TRUE(client.ok());
  const std::string img0 = Png(56, 56, 11), img1 = Png(84, 56, 12), img2 = Png(56, 84, 13);
  EncodeResult r = (*client)->Encode({Item(img0), Item(img1)});
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EncodeResult r2 = (*client)->Encode({Item(img2)});
  ASSERT_TRUE(r2.status.ok());
  ServerStats s = t.server->Stats();
  EXPECT_EQ(s.shm.sessions, 1);  // one session for every call
  EXPECT_EQ(s.shm.sessions_opened, 1u);
  EXPECT_EQ(s.shm.leases, 3);
  // One explicit release, then the client goes while holding the other two.
  ASSERT_TRUE(r2.items[0].shm->Release().ok());
  client->reset();
  s = t.server->Stats();
  EXPECT_EQ(s.shm.leases, 0);
  EXPECT_EQ(s.shm.released, 1u);
  EXPECT_EQ(s.shm.session_reclaimed, 2u);
  EXPECT_EQ(s.shm.expired, 0u);
  EXPECT_EQ(s.shm.sessions, 0);
  // The results outlive the client: their rows may be overwritten now, but
  // dropping them is harmless.
  r.items.clear();
}

TEST(ShmSessionTest, ClientRefusedASessionStillGetsItsRowsAndOpensOneOnceThereIsRoom) {
  TestServer t = StartSessionServer(/*max_sessions=*/1);
  auto holder = std::make_unique<RawSession>(*t.stub);  // takes the only slot
  ASSERT_TRUE(holder->named);
  ClientOptions co{.target = t.target};
  co.delivery = Delivery::kShm;
  auto client = EncodeClient::Connect(co);
  ASSERT_TRUE(client.ok());
  {
    EncodeResult r = (*client)->Encode({Item(Png(56, 56, 14))});
    ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    ASSERT_NE(r.items[0].shm, nullptr);  // served by reference, outside any session
    ExpectSameEmbedding(*r.items[0].shm->Copy(), Expected(Png(56, 56, 14)));
  }  // release queued
  EXPECT_EQ(t.server->Stats().shm.sessions_refused, 1u);
  ASSERT_TRUE(holder->stream->WritesDone());
  EXPECT_TRUE(holder->Drain().ok());
  // The client tries again a second after the refusal; poll with calls.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  int n = 0;
  while (t.server->Stats().shm.sessions_opened < 2 && std::chrono::steady_clock::now() < give_up) {
    EncodeResult r = (*client)->Encode({Item(Png(56, 56, 20 + (n++ % 4)))});
    ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_EQ(t.server->Stats().shm.sessions_opened, 2u);
  EXPECT_EQ(t.server->Stats().shm.sessions, 1);
  client->reset();  // queued releases, then the session's end
  const ShmStats s = t.server->Stats().shm;
  EXPECT_EQ(s.leases, 0);
  EXPECT_EQ(s.sessions, 0);
  EXPECT_EQ(s.expired, 0u);
}

}  // namespace
}  // namespace epd::testing
