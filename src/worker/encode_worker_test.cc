#include "epd/worker/encode_worker.h"

#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "worker_test_util.h"

namespace epd {
namespace {

using testing::Collector;
using testing::Expected;
using testing::ExpectSameEmbedding;
using testing::FakeTower;
using testing::FakeTowerOptions;
using testing::Png;
using testing::Request;

// 56x56 keeps its size under the default config: grid 1x4x4, 4 tokens.
// Png(56, 84): 56 wide, 84 high -> grid 1x6x4, 6 tokens.
constexpr std::int64_t kSmallTokens = 4;

// Every test runs with decoding inside Step (0 helpers) and with 1 and 2
// prefetch helpers: results and batches must not depend on it.
class EncodeWorkerTest : public ::testing::TestWithParam<int>, protected testing::WorkerRig {
 protected:
  WorkerOptions Options() const { return WorkerRig::Options(GetParam()); }

  std::unique_ptr<EncodeWorker> Make() { return Make(Options()); }
  using WorkerRig::Make;

  Embedding Want(const std::string& media) const { return Expected(media, tower_options_); }

  const std::string x_ = Png(56, 56, 1);
  const std::string y_ = Png(56, 56, 2);
  const std::string z_ = Png(56, 84, 3);
};

TEST_P(EncodeWorkerTest, SameImageInTwoRequestsRunsTheTowerOnce) {
  auto w = Make();
  ASSERT_TRUE(w->Submit(Request("a", {x_}), c_.For("a")).ok());
  ASSERT_TRUE(w->Submit(Request("b", {x_}), c_.For("b")).ok());
  Drain(*w);

  EXPECT_EQ(state_->items_encoded(), 1);
  ASSERT_TRUE(c_.done["a"].all_ok());
  ASSERT_TRUE(c_.done["b"].all_ok());
  const ItemResult& a = c_.done["a"].items[0];
  const ItemResult& b = c_.done["b"].items[0];
  EXPECT_EQ(a.source, ItemSource::kMiss);
  EXPECT_EQ(b.source, ItemSource::kJoined);
  EXPECT_EQ(a.key, b.key);
  ExpectSameEmbedding(*a.embedding, Want(x_));
  ExpectSameEmbedding(*b.embedding, *a.embedding);
  const WorkerStats s = w->stats();
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.joins, 1u);
  EXPECT_EQ(s.tower_items, 1u);
}

TEST_P(EncodeWorkerTest, DuplicateInsideOneRequestIsEncodedOnce) {
  auto w = Make();
  ASSERT_TRUE(w->Submit(Request("r", {x_, y_, x_}), c_.For("r")).ok());
  Drain(*w);

  ASSERT_EQ(state_->batches.size(), 1u);
  EXPECT_EQ(state_->batches[0].size(), 2u);  // x and y, not x twice
  const RequestResult& r = c_.done["r"];
  ASSERT_TRUE(r.all_ok());
  ASSERT_EQ(r.items.size(), 3u);
  EXPECT_EQ(r.items[2].source, ItemSource::kJoined);
  ExpectSameEmbedding(*r.items[0].embedding, Want(x_));
  ExpectSameEmbedding(*r.items[1].embedding, Want(y_));
  ExpectSameEmbedding(*r.items[2].embedding, *r.items[0].embedding);
  EXPECT_EQ(c_.items["r"].size(), 3u);
}

TEST_P(EncodeWorkerTest, HitIsDeliveredInsideSubmitWithBothHalves) {
  auto w = Make();
  ASSERT_TRUE(w->Submit(Request("a", {x_}), c_.For("a")).ok());
  Drain(*w);
  ASSERT_TRUE(w->Submit(Request("b", {x_}), c_.For("b")).ok());

  // Delivered before any Step.
  ASSERT_EQ(c_.done.count("b"), 1u);
  const ItemResult& hit = c_.done["b"].items[0];
  EXPECT_EQ(hit.source, ItemSource::kL1);
  ASSERT_NE(hit.embedding, nullptr);
  EXPECT_EQ(hit.embedding->deepstack_layers, 2);
  EXPECT_FALSE(hit.embedding->deepstack.empty());
  ExpectSameEmbedding(*hit.embedding, Want(x_));
  ExpectSameEmbedding(*hit.embedding, *c_.done["a"].items[0].embedding);
  EXPECT_EQ(state_->items_encoded(), 1);
  EXPECT_EQ(w->stats().hits_l1, 1u);
}

TEST_P(EncodeWorkerTest, L2HitIsPromotedWithBothHalves) {
  // One 4-token embedding: 4 * 8 * (1 + 2) * 4 = 384 bytes. L1 fits one.
  WorkerOptions o = Options();
  o.l1_capacity_bytes = 500;
  o.l2_capacity_bytes = 10'000;
  auto w = Make(o);
  ASSERT_TRUE(w->Submit(Request("a", {x_}), c_.For("a")).ok());
  Drain(*w);
  ASSERT_TRUE(w->Submit(Request("b", {y_}), c_.For("b")).ok());  // demotes x
  Drain(*w);
  ASSERT_TRUE(w->Submit(Request("c", {x_}), c_.For("c")).ok());

  const ItemResult& hit = c_.done["c"].items[0];
  EXPECT_EQ(hit.source, ItemSource::kL2);
  ExpectSameEmbedding(*hit.embedding, Want(x_));
  const WorkerStats s = w->stats();
  EXPECT_EQ(s.hits_l2, 1u);
  EXPECT_EQ(s.promotions, 1u);
  EXPECT_EQ(s.demotions, 2u);  // x on y's insert, y on x's promotion
  EXPECT_EQ(s.l1_used_bytes, 384);
  EXPECT_EQ(s.l2_used_bytes, 384);
  EXPECT_EQ(state_->items_encoded(), 2);
}

TEST_P(EncodeWorkerTest, MissJoinAndHitsAllCarryTheImagesGrid) {
  // By hand (smart_resize keeps sizes that are multiples of 28 within the
  // pixel bounds): x is 56x56 -> (1, 56/14, 56/14) = (1, 4, 4); z is 56 wide
  // and 84 high -> (1, 84/14, 56/14) = (1, 6, 4), h before w. L1 fits one
  // 4-token embedding (384 bytes), so x is demoted when z arrives.
  const GridTHW x_grid{1, 4, 4}, z_grid{1, 6, 4};
  WorkerOptions o = Options();
  o.l1_capacity_bytes = 700;
  o.l2_capacity_bytes = 10'000;
  auto w = Make(o);
  ASSERT_TRUE(w->Submit(Request("miss", {x_, x_}), c_.For("miss")).ok());
  Drain(*w);
  ASSERT_TRUE(w->Submit(Request("l1", {x_}), c_.For("l1")).ok());
  ASSERT_TRUE(w->Submit(Request("z", {z_}), c_.For("z")).ok());  // demotes x
  Drain(*w);
  ASSERT_TRUE(w->Submit(Request("l2", {x_}), c_.For("l2")).ok());

  const std::vector<std::pair<std::string, ItemSource>> x_deliveries = {
      {"miss", ItemSource::kMiss}, {"l1", ItemSource::kL1}, {"l2", ItemSource::kL2}};
  for (const auto& [id, source] : x_deliveries) {
    ASSERT_TRUE(c_.done[id].all_ok()) << id;
    const ItemResult& r = c_.done[id].items[0];
    EXPECT_EQ(r.source, source) << id;
    EXPECT_EQ(r.embedding->grid, x_grid) << id;
    EXPECT_EQ(r.embedding->grid.tokens(), r.embedding->tokens) << id;
  }
  EXPECT_EQ(c_.done["miss"].items[1].source, ItemSource::kJoined);
  EXPECT_EQ(c_.done["miss"].items[1].embedding->grid, x_grid);
  ASSERT_TRUE(c_.done["z"].all_ok());
  EXPECT_EQ(c_.done["z"].items[0].embedding->grid, z_grid);
  EXPECT_EQ(c_.done["z"].items[0].embedding->tokens, 6);
  // The tower was handed the same grids.
  ASSERT_EQ(state_->batches.size(), 2u);
  EXPECT_EQ(state_->batches[0], std::vector<GridTHW>{x_grid});
  EXPECT_EQ(state_->batches[1], std::vector<GridTHW>{z_grid});
}

// Regression: an entry larger than L1 but not L2 was never cached (the tiered
// put skips it), so every repeat ran the tower again. It now lives in L2, and
// a hit on it is served from there without a promotion that would lose it.
TEST_P(EncodeWorkerTest, EntryLargerThanL1ButNotL2IsCachedInL2) {
  // z: 6 tokens * 8 hidden * (1 + 2) * 4 bytes = 576 > L1; x: 4 tokens, 384 bytes, fits L1.
  WorkerOptions o = Options();
  o.l1_capacity_bytes = 500;
  o.l2_capacity_bytes = 10'000;
  auto w = Make(o);
  ASSERT_TRUE(w->Submit(Request("a", {z_, x_}), c_.For("a")).ok());
  Drain(*w);
  ASSERT_TRUE(c_.done["a"].all_ok());
  WorkerStats s = w->stats();
  EXPECT_EQ(s.l1_entries, 1);
  EXPECT_EQ(s.l1_used_bytes, 384);
  EXPECT_EQ(s.l2_entries, 1);
  EXPECT_EQ(s.l2_used_bytes, 576);

  for (const char* id : {"b", "c"}) {
    ASSERT_TRUE(w->Submit(Request(id, {z_, x_}), c_.For(id)).ok());
    ASSERT_EQ(c_.done.count(id), 1u) << id;  // both hits, delivered inside Submit
    const RequestResult& r = c_.done[id];
    ASSERT_TRUE(r.all_ok());
    EXPECT_EQ(r.items[0].source, ItemSource::kL2);
    EXPECT_EQ(r.items[1].source, ItemSource::kL1);
    ExpectSameEmbedding(*r.items[0].embedding, Want(z_));
    ExpectSameEmbedding(*r.items[1].embedding, Want(x_));
  }
  EXPECT_EQ(state_->items_encoded(), 2);  // z and x once each
  s = w->stats();
  EXPECT_EQ(s.hits_l2, 2u);
  EXPECT_EQ(s.hits_l1, 2u);
  EXPECT_EQ(s.promotions, 0u);
  EXPECT_EQ(s.demotions, 0u);
  EXPECT_EQ(s.l1_used_bytes, 384);
  EXPECT_EQ(s.l2_entries, 1);
  EXPECT_EQ(s.l2_used_bytes, 576);
}

TEST_P(EncodeWorkerTest, WrongRowCountFailsOnlyItsBatch) {
  WorkerOptions o = Options();
  o.max_items_per_batch = 1;
  auto w = Make(o);
  ASSERT_TRUE(w->Submit(Request("a", {x_}), c_.For("a")).ok());
  ASSERT_TRUE(w->Submit(Request("b", {y_}), c_.For("b")).ok());
  state_->extra_rows_next = 3;
  Drain(*w);

  const ItemResult& bad = c_.done["a"].items[0];
  EXPECT_EQ(bad.status.code(), StatusCode::kInternal);
  EXPECT_EQ(bad.status.message(), "vision tower returned 7 rows for a batch of 1 items totalling 4 tokens");
  EXPECT_EQ(bad.embedding, nullptr);
  EXPECT_TRUE(c_.done["a"].status.ok());  // the request completed; its item failed
  ASSERT_TRUE(c_.done["b"].all_ok());
  ExpectSameEmbedding(*c_.done["b"].items[0].embedding, Want(y_));

  // Nothing was cached for x, and the worker still serves it.
  WorkerStats s = w->stats();
  EXPECT_EQ(s.l1_entries, 1);
  EXPECT_EQ(s.tower_failures, 1u);
  EXPECT_EQ(s.errors[StatusCode::kInternal], 1u);
  ASSERT_TRUE(w->Submit(Request("c", {x_}), c_.For("c")).ok());
  Drain(*w);
  ASSERT_TRUE(c_.done["c"].all_ok());
  EXPECT_EQ(c_.done["c"].items[0].source, ItemSource::kMiss);
  ExpectSameEmbedding(*c_.done["c"].items[0].embedding, Want(x_));
}

TEST_P(EncodeWorkerTest, TowerFailureFailsEveryWaiterOfItsBatchOnly) {
  WorkerOptions o = Options();
  o.max_items_per_batch = 1;
  auto w = Make(o);
  ASSERT_TRUE(w->Submit(Request("a", {x_}), c_.For("a")).ok());
  ASSERT_TRUE(w->Submit(Request("b", {x_, y_}), c_.For("b")).ok());  // joins x, adds y
  state_->fail_next = Internal("out of memory in block 3");
  Drain(*w);

  for (const char* id : {"a", "b"}) {
    const ItemResult& r = c_.done[id].items[0];
    EXPECT_EQ(r.status.code(), StatusCode::kInternal) << id;
    EXPECT_EQ(r.status.message(), "vision tower failed: out of memory in block 3") << id;
  }
  EXPECT_TRUE(c_.done["b"].items[1].status.ok());
  ExpectSameEmbedding(*c_.done["b"].items[1].embedding, Want(y_));
  const WorkerStats s = w->stats();
  EXPECT_EQ(s.tower_batches, 2u);
  EXPECT_EQ(s.errors.at(StatusCode::kInternal), 2u);
  EXPECT_EQ(s.in_flight_requests, 0);
}

TEST_P(EncodeWorkerTest, CachedEntryDoesNotAliasTheTowerBuffer) {
  auto w = Make();
  ASSERT_TRUE(w->Submit(Request("a", {x_}), c_.For("a")).ok());
  Drain(*w);
  ASSERT_TRUE(w->Submit(Request("b", {y_}), c_.For("b")).ok());  // the tower rewrites its buffer
  Drain(*w);
  std::fill(state_->buffer.begin(), state_->buffer.end(), std::byte{0xAB});

  ASSERT_TRUE(w->Submit(Request("c", {x_}), c_.For("c")).ok());
  ASSERT_EQ(c_.done["c"].items[0].source, ItemSource::kL1);
  ExpectSameEmbedding(*c_.done["c"].items[0].embedding, Want(x_));
  ExpectSameEmbedding(*c_.done["a"].items[0].embedding, Want(x_));
}

TEST_P(EncodeWorkerTest, EmbeddingIsChargedMainPlusDeepstackBytes) {
  // 280x280 -> grid 1x20x20 -> 100 tokens; hidden 2048, 3 deepstack layers,
  // bf16: 100 * 2048 * (1 + 3) * 2 = 1,638,400 bytes.
  auto w = Make(Options(), FakeTowerOptions{2048, 3, DType::kBFloat16});
  const std::string big = Png(280, 280, 4);
  ASSERT_TRUE(w->Submit(Request("a", {big}), c_.For("a")).ok());
  Drain(*w);
  const ItemResult& r = c_.done["a"].items[0];
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(r.embedding->tokens, 100);
  EXPECT_EQ(r.embedding->main.size(), 409'600u);
  EXPECT_EQ(r.embedding->deepstack.size(), 1'228'800u);
  EXPECT_EQ(w->stats().l1_used_bytes, 1'638'400);
  ExpectSameEmbedding(*r.embedding, Want(big));
}

TEST_P(EncodeWorkerTest, BadImagesFailOnlyTheirItems) {
  using testing::Bytes;
  auto w = Make();
  Bytes bomb = testing::ToBytes(Png(56, 56, 9));
  testing::SetPngSize(bomb, 100'000, 100'000);
  Bytes zero = testing::ToBytes(Png(56, 56, 10));
  testing::SetPngSize(zero, 0, 0);
  std::string corrupt = Png(56, 56, 11);
  for (std::size_t i = 60; i < corrupt.size() - 20; ++i) corrupt[i] = static_cast<char>(corrupt[i] ^ 0x5a);
  const std::string truncated = testing::ToString(testing::FirstHalf(testing::ToBytes(Png(56, 56, 12))));
  const std::vector<std::string> bad = {"not an image",         corrupt, truncated, "", testing::ToString(zero),
                                        testing::ToString(bomb)};

  ASSERT_TRUE(w->Submit(Request("good", {x_}), c_.For("good")).ok());
  std::vector<std::string> mixed = bad;
  mixed.insert(mixed.begin() + 2, y_);  // a good item among the bad ones
  ASSERT_TRUE(w->Submit(Request("mixed", mixed), c_.For("mixed")).ok());
  // Bad headers fail at once (not an image, empty, zero-sized, bomb); bad
  // pixel data (corrupt, truncated) when the batch decodes it.
  EXPECT_EQ(c_.items["mixed"].size(), 4u);
  Drain(*w);

  ASSERT_TRUE(c_.done["good"].all_ok());
  ExpectSameEmbedding(*c_.done["good"].items[0].embedding, Want(x_));
  const RequestResult& m = c_.done["mixed"];
  ASSERT_EQ(m.items.size(), mixed.size());
  for (std::size_t i = 0; i < mixed.size(); ++i) {
    if (i == 2) {
      ASSERT_TRUE(m.items[i].status.ok()) << m.items[i].status.ToString();
      ExpectSameEmbedding(*m.items[i].embedding, Want(y_));
    } else {
      EXPECT_EQ(m.items[i].status.code(), StatusCode::kInvalidArgument) << "item " << i;
      // ItemResult::index names the item; the message does not repeat it.
      EXPECT_EQ(m.items[i].index, static_cast<std::int64_t>(i));
      EXPECT_NE(m.items[i].status.message().rfind("item ", 0), 0u) << m.items[i].status.message();
      EXPECT_EQ(m.items[i].embedding, nullptr);
    }
  }
  EXPECT_NE(m.items[6].status.message().find("too many pixels"), std::string::npos) << m.items[6].status.message();
  WorkerStats s = w->stats();
  EXPECT_EQ(s.errors[StatusCode::kInvalidArgument], bad.size());
  EXPECT_EQ(s.l1_entries, 2);
  EXPECT_EQ(s.tower_items, 2u);
  EXPECT_EQ(s.items, 1 + mixed.size());
  EXPECT_EQ(s.misses, 1 + mixed.size());
}

TEST_P(EncodeWorkerTest, ExpectedTokensThatDisagreeWithTheHeaderFailTheItemEvenOnAHit) {
  auto w = Make();
  ASSERT_TRUE(w->Submit(Request("a", {x_}), c_.For("a")).ok());
  Drain(*w);
  // x_ is 56x56: grid 1x4x4, 16 patches, 4 tokens after the 2x2 merge.
  EncodeRequest b = Request("b", {x_});
  b.items[0].expected_tokens = kSmallTokens + 1;
  ASSERT_TRUE(w->Submit(std::move(b), c_.For("b")).ok());
  ASSERT_EQ(c_.done.count("b"), 1u);  // failed at once, not served from the cache
  const ItemResult& bad = c_.done["b"].items[0];
  EXPECT_EQ(bad.status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status.message(), "expected_tokens is 5 but the 56x56 image gives 4 tokens (grid 1x4x4, merge 2)");
  EXPECT_EQ(bad.embedding, nullptr);
  EXPECT_EQ(bad.source, ItemSource::kMiss);
  EXPECT_EQ(state_->items_encoded(), 1);

  EncodeRequest neg = Request("neg", {x_});
  neg.items[0].expected_tokens = -1;
  ASSERT_TRUE(w->Submit(std::move(neg), c_.For("neg")).ok());
  EXPECT_EQ(c_.done["neg"].items[0].status.code(), StatusCode::kInvalidArgument);

  EncodeRequest c = Request("c", {x_});
  c.items[0].expected_tokens = kSmallTokens;
  ASSERT_TRUE(w->Submit(std::move(c), c_.For("c")).ok());
  EXPECT_EQ(c_.done["c"].items[0].source, ItemSource::kL1);
}

TEST_P(EncodeWorkerTest, CallerKeyHitIsCheckedAgainstTheHeader) {
  auto w = Make();
  EncodeRequest a = Request("a", {x_});  // 4 tokens
  a.items[0].caller_key = "gateway-hash-1";
  ASSERT_TRUE(w->Submit(std::move(a), c_.For("a")).ok());
  Drain(*w);

  // Same caller key, but the header says 56x84 (6 tokens): re-encoded.
  EncodeRequest b = Request("b", {z_});
  b.items[0].caller_key = "gateway-hash-1";
  ASSERT_TRUE(w->Submit(std::move(b), c_.For("b")).ok());
  Drain(*w);
  EXPECT_EQ(w->stats().shape_mismatches, 1u);
  EXPECT_EQ(c_.done["b"].items[0].embedding->tokens, 6);
  ExpectSameEmbedding(*c_.done["b"].items[0].embedding, Want(z_));

  // A key without media cannot be checked against a header; the hit is served.
  EncodeRequest c = Request("c", {""});
  c.items[0].caller_key = "gateway-hash-1";
  ASSERT_TRUE(w->Submit(std::move(c), c_.For("c")).ok());
  ASSERT_EQ(c_.done.count("c"), 1u);
  EXPECT_EQ(c_.done["c"].items[0].source, ItemSource::kL1);
  ExpectSameEmbedding(*c_.done["c"].items[0].embedding, Want(z_));

  EncodeRequest d = Request("d", {x_});
  d.items[0].caller_key = "";
  ASSERT_TRUE(w->Submit(std::move(d), c_.For("d")).ok());
  EXPECT_EQ(c_.done["d"].items[0].status.code(), StatusCode::kInvalidArgument);
}

TEST_P(EncodeWorkerTest, FullSinkStartsNoBatch) {
  bool full = true;
  WorkerOptions o = Options();
  o.sink_full = [&] { return full; };
  auto w = Make(o);
  ASSERT_TRUE(w->Submit(Request("a", {x_}), c_.For("a")).ok());
  EXPECT_EQ(w->Step(), 0);
  EXPECT_EQ(w->Step(), 0);
  EXPECT_TRUE(state_->batches.empty());
  EXPECT_TRUE(w->HasQueuedWork());
  EXPECT_EQ(w->stats().sink_full_stalls, 2u);
  full = false;
  EXPECT_EQ(w->Step(), 1);
  EXPECT_TRUE(c_.done["a"].all_ok());
}

TEST_P(EncodeWorkerTest, DuplicateInFlightIdIsRejected) {
  auto w = Make();
  ASSERT_TRUE(w->Submit(Request("a", {x_}), c_.For("a")).ok());
  Status s = w->Submit(Request("a", {y_}), c_.For("a"));
  EXPECT_EQ(s.code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(s.message(), "request 'a' is already in flight");
  EXPECT_EQ(w->stats().pending_items, 1);
  Drain(*w);
  EXPECT_EQ(state_->items_encoded(), 1);
  // Once finished, the id is free again.
  EXPECT_TRUE(w->Submit(Request("a", {x_}), {}).ok());
  EXPECT_EQ(w->Submit(Request("", {x_}), {}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w->stats().rejected_requests, 2u);
}

TEST_P(EncodeWorkerTest, QueueLimitRejectsTheWholeRequest) {
  WorkerOptions o = Options();
  o.max_pending_items = 2;
  auto w = Make(o);
  ASSERT_TRUE(w->Submit(Request("a", {x_}), c_.For("a")).ok());
  Status s = w->Submit(Request("b", {y_, z_}), c_.For("b"));
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(), "request 'b' would queue 2 items on top of 1 pending; the limit is 2 (retry later)");
  EXPECT_EQ(c_.done.count("b"), 0u);
  EXPECT_EQ(c_.items.count("b"), 0u);
  WorkerStats st = w->stats();
  EXPECT_EQ(st.pending_items, 1);
  EXPECT_EQ(st.requests, 1u);
  // x joins the queued computation and y twice is one computation: fits.
  ASSERT_TRUE(w->Submit(Request("c", {y_, x_, y_}), c_.For("c")).ok());
  EXPECT_EQ(w->stats().pending_items, 2);
  Drain(*w);
  EXPECT_TRUE(c_.done["c"].all_ok());
}

TEST_P(EncodeWorkerTest, RequestWithMoreMissesThanTheQueueHoldsIsInvalidArgument) {
  WorkerOptions o = Options();
  o.max_pending_items = 2;
  auto w = Make(o);
  // Three distinct misses on an empty queue of two: no wait would ever help.
  Status s = w->Submit(Request("big", {x_, y_, z_}), c_.For("big"));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("3 items to queue"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("max_pending_items 2"), std::string::npos) << s.message();
  EXPECT_EQ(c_.done.count("big"), 0u);
  EXPECT_EQ(w->stats().pending_items, 0);
  EXPECT_EQ(w->stats().rejected_requests, 1u);
  // Duplicates are one computation: x, x, y is two misses and fits.
  EXPECT_TRUE(w->Submit(Request("fits", {x_, x_, y_}), c_.For("fits")).ok());
  Drain(*w);
  EXPECT_TRUE(c_.done["fits"].all_ok());
}

TEST_P(EncodeWorkerTest, CancelDropsQueuedItemsNobodyElseWaitsOn) {
  auto w = Make();
  ASSERT_TRUE(w->Submit(Request("a", {x_, y_}), c_.For("a")).ok());
  ASSERT_TRUE(w->Submit(Request("b", {y_}), c_.For("b")).ok());
  EXPECT_EQ(w->stats().pending_items, 2);
  ASSERT_TRUE(w->Cancel("a"));
  EXPECT_FALSE(w->Cancel("a"));
  EXPECT_FALSE(w->Cancel("never-submitted"));

  const RequestResult& a = c_.done["a"];
  EXPECT_EQ(a.status.code(), StatusCode::kCancelled);
  for (const ItemResult& r : a.items) EXPECT_EQ(r.status.code(), StatusCode::kCancelled);
  EXPECT_EQ(w->stats().pending_items, 1);  // y stays for b
  Drain(*w);
  ASSERT_EQ(state_->batch_ids.size(), 1u);
  ASSERT_EQ(state_->batch_ids[0].size(), 1u);
  ASSERT_TRUE(c_.done["b"].all_ok());
  ExpectSameEmbedding(*c_.done["b"].items[0].embedding, Want(y_));
  // The one item the tower saw was y: its s_0 is y's main[0][0].
  float y_s0;
  std::memcpy(&y_s0, Want(y_).main.data(), sizeof(y_s0));
  EXPECT_EQ(state_->batch_ids[0][0], y_s0);
  EXPECT_EQ(w->stats().cancelled_requests, 1u);
}

TEST_P(EncodeWorkerTest, CancelledRequestIdCanBeReusedWhileItsItemLivesOn) {
  auto w = Make();
  ASSERT_TRUE(w->Submit(Request("a", {x_}), c_.For("a")).ok());
  ASSERT_TRUE(w->Submit(Request("b", {x_}), c_.For("b")).ok());  // joins a's item
  ASSERT_TRUE(w->Cancel("a"));
  Collector again;
  ASSERT_TRUE(w->Submit(Request("a", {y_}), again.For("a")).ok());  // same id, same index 0
  EXPECT_EQ(w->stats().pending_items, 2);
  Drain(*w);
  ASSERT_TRUE(c_.done["b"].all_ok());
  ExpectSameEmbedding(*c_.done["b"].items[0].embedding, Want(x_));
  ASSERT_TRUE(again.done["a"].all_ok());
  ExpectSameEmbedding(*again.done["a"].items[0].embedding, Want(y_));
}

TEST_P(EncodeWorkerTest, FailAllCompletesEveryRequestAndEmptiesTheQueue) {
  auto w = Make();
  ASSERT_TRUE(w->Submit(Request("a", {x_}), c_.For("a")).ok());
  ASSERT_TRUE(w->Submit(Request("b", {y_, x_}), c_.For("b")).ok());
  EXPECT_EQ(w->FailAll(Status(StatusCode::kUnavailable, "shutting down")), 2);
  EXPECT_FALSE(w->HasQueuedWork());
  EXPECT_EQ(c_.done["a"].status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(c_.done["b"].items[1].status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(w->stats().in_flight_requests, 0);
  EXPECT_TRUE(state_->batches.empty());
}

TEST_P(EncodeWorkerTest, EmptyRequestCompletesAtOnce) {
  auto w = Make();
  ASSERT_TRUE(w->Submit(Request("a", {}), c_.For("a")).ok());
  ASSERT_EQ(c_.done.count("a"), 1u);
  EXPECT_TRUE(c_.done["a"].all_ok());
  EXPECT_TRUE(c_.done["a"].items.empty());
}

TEST_P(EncodeWorkerTest, BatchesFollowTheTokenBudget) {
  // Budget 10 tokens: 4 + 4 fits, the next 6 does not.
  WorkerOptions o = Options();
  o.max_tokens_per_batch = 10;
  auto w = Make(o);
  ASSERT_TRUE(w->Submit(Request("a", {x_, y_, z_}), c_.For("a")).ok());
  Drain(*w);
  ASSERT_EQ(state_->batches.size(), 2u);
  EXPECT_EQ(state_->batches[0].size(), 2u);
  EXPECT_EQ(state_->batches[1].size(), 1u);
  EXPECT_EQ(state_->batches[1][0], (GridTHW{1, 6, 4}));
  const WorkerStats s = w->stats();
  EXPECT_EQ(s.tower_tokens, 14u);
  EXPECT_EQ(s.tower_batches, 2u);
}

TEST_P(EncodeWorkerTest, WithoutCacheOrDedupEveryItemRunsTheTower) {
  WorkerOptions o = Options();
  o.l1_capacity_bytes = 0;
  o.l2_capacity_bytes = 0;
  o.dedup_in_flight = false;
  auto w = Make(o);
  ASSERT_TRUE(w->Submit(Request("a", {x_, x_}), c_.For("a")).ok());
  Drain(*w);
  ASSERT_TRUE(w->Submit(Request("b", {x_}), c_.For("b")).ok());
  Drain(*w);
  EXPECT_EQ(state_->items_encoded(), 3);
  EXPECT_EQ(w->stats().misses, 3u);
  ExpectSameEmbedding(*c_.done["b"].items[0].embedding, Want(x_));
}

TEST_P(EncodeWorkerTest, WorkIsAcceptedWhileTheTowerRuns) {
  auto w = Make();
  state_->Close();
  ASSERT_TRUE(w->Submit(Request("a", {x_}), c_.For("a")).ok());
  ASSERT_TRUE(w->StartBatch());
  state_->WaitForEncodes(1);
  EXPECT_TRUE(w->TowerBusy());
  EXPECT_EQ(w->OutstandingBatches(), 1);
  EXPECT_FALSE(w->BatchFinished());

  ASSERT_TRUE(w->Submit(Request("b", {x_, y_}), c_.For("b")).ok());  // x joins the running computation
  EXPECT_FALSE(w->StartBatch());                                     // one batch on the tower at a time
  ASSERT_TRUE(w->Cancel("a"));                                       // x keeps running for b
  EXPECT_EQ(c_.done["a"].status.code(), StatusCode::kCancelled);
  state_->Open();
  EXPECT_EQ(w->FinishBatch(), 1);
  EXPECT_EQ(c_.items["b"].size(), 1u);
  EXPECT_EQ(c_.items["b"][0].source, ItemSource::kJoined);
  ExpectSameEmbedding(*c_.items["b"][0].embedding, Want(x_));
  EXPECT_EQ(w->stats().l1_entries, 1);  // cached although its first requester left
  EXPECT_EQ(w->Step(), 1);              // y
  ASSERT_TRUE(c_.done["b"].all_ok());
  ExpectSameEmbedding(*c_.done["b"].items[1].embedding, Want(y_));
  EXPECT_EQ(state_->items_encoded(), 2);
}

TEST_P(EncodeWorkerTest, NextBatchStartsBeforeThePreviousIsCollected) {
  WorkerOptions o = Options();
  o.max_items_per_batch = 1;
  auto w = Make(o);
  ASSERT_TRUE(w->Submit(Request("a", {x_}), c_.For("a")).ok());
  ASSERT_TRUE(w->Submit(Request("b", {y_}), c_.For("b")).ok());
  ASSERT_TRUE(w->StartBatch());
  state_->WaitForEncodes(1);
  while (!w->BatchFinished()) std::this_thread::yield();
  EXPECT_FALSE(w->TowerBusy());
  ASSERT_TRUE(w->StartBatch());  // the tower is idle; batch a awaits collection
  EXPECT_EQ(w->OutstandingBatches(), 2);
  EXPECT_EQ(c_.done.count("a"), 0u);
  EXPECT_EQ(w->FinishBatch(), 1);  // oldest first
  ASSERT_TRUE(c_.done["a"].all_ok());
  EXPECT_EQ(c_.done.count("b"), 0u);
  EXPECT_EQ(w->FinishBatch(), 1);
  ASSERT_TRUE(c_.done["b"].all_ok());
  EXPECT_EQ(w->FinishBatch(), 0);
  ExpectSameEmbedding(*c_.done["b"].items[0].embedding, Want(y_));
}

TEST_P(EncodeWorkerTest, CreateRejectsBadOptionsNamingTheField) {
  WorkerOptions o = Options();
  o.model_id = "";
  auto w = EncodeWorker::Create(o, std::make_unique<FakeTower>());
  EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w.status().message(), "model_id is empty");
  o = Options();
  o.max_tokens_per_batch = 0;
  EXPECT_EQ(EncodeWorker::Create(o, std::make_unique<FakeTower>()).status().message(),
            "max_tokens_per_batch must be > 0, got 0");
  o = Options();
  o.l1_admission = L1Admission::kDoorkeeper;
  o.l1_admission_window = 0;  // the filter itself would throw: refused as a Status first
  EXPECT_EQ(EncodeWorker::Create(o, std::make_unique<FakeTower>()).status().message(),
            "l1_admission_window must be in [1, 2^27] requests, got 0");
  o = Options();
  o.preprocess.patch_size = 16;
  EXPECT_EQ(EncodeWorker::Create(o, std::make_unique<FakeTower>()).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeWorker::Create(Options(), nullptr).status().code(), StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(DecodeThreads, EncodeWorkerTest, ::testing::Values(0, 1, 2),
                         [](const ::testing::TestParamInfo<int>& p) { return std::to_string(p.param) + "Helpers"; });

}  // namespace
}  // namespace epd
