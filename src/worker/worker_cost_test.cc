// The worker's measured entry costs (issue 26) and its check of adopted
// values (issue 27, fault 3), on a FakeTower.
//
// Costs: an entry's cost is its decode plus its token share of its batch's
// tower call, so the two items of one batch split the tower time 1:3 by their
// tokens (4 and 12), whatever the decode took; the costs of a batch's entries
// sum to its decodes plus its tower time; an L2-only entry keeps its cost
// across hits. Adoption: a ready value that breaks one prediction of the
// request is refused (counted, handed out by TakeRefused) and re-encoded.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

#include "adopt_check.h"
#include "adopted_value.h"
#include "epd/worker/encode_worker.h"
#include "test_names.h"
#include "tower_runner.h"
#include "worker_test_util.h"

namespace epd {
namespace {

using internal::AdoptExpectation;
using internal::CheckAdoptedValue;
using testing::Expected;
using testing::ExpectSameEmbedding;
using testing::FakeTower;
using testing::FakeTowerOptions;
using testing::Png;
using testing::Request;

// Png(56, 56): grid (1, 4, 4), 4 tokens. Png(112, 56): grid (1, 4, 8), 8.
// Png(112, 112): grid (1, 8, 8), 16 tokens. Png(56, 168): (1, 12, 4), 12.
class WorkerCostTest : public ::testing::Test, protected testing::WorkerRig {
 protected:
  std::unique_ptr<EncodeWorker> Make(WorkerOptions o = Options(0)) { return WorkerRig::Make(std::move(o)); }

  // Submits the one-item request `r` as the worker loop does after finding
  // `value` (encode cost `seconds`) for it in the shared tier.
  Status SubmitWithL3Value(EncodeWorker& w, EncodeRequest r, const std::string& id, Embedding value, double seconds) {
    std::vector<internal::AdoptedValue> adopted{{std::make_shared<const Embedding>(std::move(value)), seconds}};
    return internal::LoopSubmit::Submit(w, std::move(r), c_.For(id), {}, std::move(adopted));
  }

  // A ready value `bad` for `img` (the n-th refusal): refused, counted,
  // handed out for the tier's deletion, and re-encoded with a fresh
  // encode's rows.
  void ExpectReadyRefused(EncodeWorker& w, const std::string& img, Embedding bad, const std::string& why,
                          std::uint64_t n) {
    const std::string id = test_util::Name("r", static_cast<long long>(n));
    ASSERT_TRUE(SubmitWithL3Value(w, Request(id, {img}), id, std::move(bad), -1).ok());
    std::vector<EncodeWorker::RefusedValue> refused = w.TakeRefused();
    ASSERT_EQ(refused.size(), 1u);
    EXPECT_EQ(refused[0].key, *w.ItemKeys(Request("k", {img}))[0]);
    EXPECT_EQ(refused[0].why, why);
    EXPECT_TRUE(w.TakeRefused().empty());
    Drain(w);
    const ItemResult& item = c_.done[id].items[0];
    ASSERT_TRUE(item.status.ok()) << item.status.ToString();
    EXPECT_EQ(item.source, ItemSource::kMiss);
    ExpectSameEmbedding(*item.embedding, Expected(img));
    EXPECT_EQ(w.stats().adopt_rejections, n);
    EXPECT_EQ(w.stats().hits_l3, 0u);
  }

  // Submits `media` as request `id` and runs it to completion.
  const RequestResult& Run(EncodeWorker& w, const std::string& id, std::vector<std::string> media) {
    EXPECT_TRUE(w.Submit(Request(id, std::move(media)), c_.For(id)).ok());
    Drain(w);
    return c_.done[id];
  }
};

TEST(EntrySeconds, IsTheDecodePlusTheTokenShareOfTheTowerCall) {
  internal::Batch b;
  b.tower_ms = 400;
  b.tokens = 16;
  internal::BatchEntry e;
  e.image.grid = {1, 4, 4};  // 4 tokens at merge 2
  e.image.merge_size = 2;
  e.decode_seconds = 0.01;
  // 0.01 + 0.4 * 4 / 16, plus 0.5 s of prior work.
  EXPECT_DOUBLE_EQ(internal::EntrySeconds(b, e, 0), 0.11);
  EXPECT_DOUBLE_EQ(internal::EntrySeconds(b, e, 0.5), 0.61);
  b.tokens = 0;  // no item decoded: no share
  EXPECT_DOUBLE_EQ(internal::EntrySeconds(b, e, 0), 0.01);
}

TEST_F(WorkerCostTest, BatchMatesSplitTheTowerTimeByTokens) {
  auto w = Make();
  const std::string a = Png(56, 56, 1), b = Png(56, 168, 2);  // 4 and 12 tokens
  ASSERT_TRUE(w->Submit(Request("r", {a, b}), c_.For("r")).ok());
  // The tower is held for 300 ms, so its share dwarfs the decodes.
  state_->Close();
  ASSERT_TRUE(w->StartBatch(nullptr));
  state_->WaitForEncodes(1);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  state_->Open();
  ASSERT_EQ(w->FinishBatch(), 2);
  ASSERT_TRUE(c_.done["r"].all_ok());
  const WorkerStats m = w->stats();
  const double tower_s = m.tower_seconds;
  ASSERT_GE(tower_s, 0.3);
  // The entries' costs sum to the decodes plus the tower call.
  EXPECT_GT(m.miss_seconds, tower_s);
  EXPECT_LT(m.miss_seconds - tower_s, 0.05) << "two 56-pixel-wide PNG decodes";
  EXPECT_EQ(m.miss_bytes, static_cast<std::uint64_t>(Expected(a).nbytes() + Expected(b).nbytes()));

  // Each entry's cost, read back as the seconds its L1 hit saves.
  Run(*w, "ha", {a});
  const double cost_a = w->stats().hit_seconds_l1;
  Run(*w, "hb", {b});
  const double cost_b = w->stats().hit_seconds_l1 - cost_a;
  EXPECT_NEAR(cost_a + cost_b, m.miss_seconds, 1e-9);
  // Shares 1/4 and 3/4 of the tower call, each plus its own decode.
  EXPECT_NEAR(cost_a, tower_s / 4, 0.025);
  EXPECT_NEAR(cost_b, 3 * tower_s / 4, 0.025);
  const WorkerStats s = w->stats();
  EXPECT_EQ(s.hit_bytes_l1, m.miss_bytes);
  EXPECT_DOUBLE_EQ(s.encode_seconds_saved, s.hit_seconds_l1);
  EXPECT_EQ(s.hit_seconds_l2, 0);
}

TEST_F(WorkerCostTest, AnL2OnlyEntryKeepsItsCostAcrossHits) {
  WorkerOptions o = Options(0);
  const std::string img = Png(112, 112, 3);  // 16 tokens x 8 x 3 x 4 bytes = 1536 bytes
  o.l1_capacity_bytes = 1000;                // too small for it: placed in L2 and served from there
  o.l2_capacity_bytes = 1 << 20;
  auto w = Make(o);
  ASSERT_TRUE(Run(*w, "m", {img}).all_ok());
  const double cost = w->stats().miss_seconds;
  ASSERT_GT(cost, 0);
  for (int i = 0; i < 3; ++i) {
    const RequestResult& r = Run(*w, test_util::Name("h", i), {img});
    ASSERT_TRUE(r.all_ok());
    EXPECT_EQ(r.items[0].source, ItemSource::kL2);
  }
  // Without the cost on the re-put, the second and third hits would count
  // 1536 bytes x 1e-9 s each.
  EXPECT_NEAR(w->stats().hit_seconds_l2, 3 * cost, 1e-12);
  EXPECT_EQ(w->stats().hit_bytes_l2, 3u * 1536u);
  EXPECT_EQ(state_->items_encoded(), 1);
}

TEST_F(WorkerCostTest, GdsfAndTheDoorkeeperReachTheTiers) {
  WorkerOptions o = Options(0);
  o.l1_admission = L1Admission::kDoorkeeper;
  o.eviction = EvictionPolicy::kGdsf;
  auto w = Make(o);
  const std::string img = Png(56, 56, 4);
  ASSERT_TRUE(Run(*w, "a", {img}).all_ok());
  // A first request: put into L2, not L1.
  WorkerStats s = w->stats();
  EXPECT_EQ(s.l1_admission_rejections, 1u);
  EXPECT_EQ(s.l1_entries, 0);
  EXPECT_EQ(s.l2_entries, 1);
  EXPECT_EQ(s.l2_write_bytes, Expected(img).nbytes());
  EXPECT_EQ(Run(*w, "b", {img}).items[0].source, ItemSource::kL2);  // its second: promoted
  s = w->stats();
  EXPECT_EQ(s.l1_entries, 1);
  EXPECT_EQ(s.l1_write_bytes, Expected(img).nbytes());
  EXPECT_DOUBLE_EQ(s.hit_seconds_l2, s.miss_seconds);
}

TEST_F(WorkerCostTest, PromoteRateMustBeFiniteAndNonNegative) {
  WorkerOptions o = Options(0);
  o.promote_seconds_per_byte = -1;
  EXPECT_EQ(o.Validate().message(), "promote_seconds_per_byte must be finite and >= 0, got -1.000000");
  o.promote_seconds_per_byte = std::numeric_limits<double>::infinity();
  EXPECT_EQ(o.Validate().code(), StatusCode::kInvalidArgument);
}

// --- adoption ---

Embedding Value(const std::string& img, FakeTowerOptions t = {}) { return Expected(img, t); }

void PutFloat(std::vector<std::byte>& v, std::size_t index, float x) { std::memcpy(v.data() + 4 * index, &x, 4); }

TEST(CheckAdoptedValue, NamesTheFirstPredictionTheValueBreaks) {
  const FakeTower tower;
  const std::string img = Png(56, 56, 5);
  const AdoptExpectation want{4, GridTHW{1, 4, 4}};
  auto check = [&](const Embedding& e) { return CheckAdoptedValue(e, want, tower, 2); };
  EXPECT_TRUE(check(Value(img)).ok());
  Embedding g = Value(img);
  g.grid = {1, 2, 8};  // the same 4 tokens, another shape
  EXPECT_EQ(check(g).message(),
            "the shared tier's value has grid (1, 2, 8), the image's header gives (1, 4, 4); refused and re-encoded");
  EXPECT_EQ(check(g).code(), StatusCode::kDataLoss);
  g.grid = {0, 0, 0};
  EXPECT_EQ(CheckAdoptedValue(g, {4, std::nullopt}, tower, 2).message(),
            "the shared tier's value has grid (0, 0, 0), which does not give its 4 tokens at merge size 2; refused "
            "and re-encoded");
  EXPECT_EQ(CheckAdoptedValue(Value(img), {6, std::nullopt}, tower, 2).message(),
            "the shared tier's value has tokens 4, the item needs 6; refused and re-encoded");
  EXPECT_EQ(check(Value(img, {.hidden = 16})).message(),
            "the shared tier's value has hidden size 16, this tower's is 8; refused and re-encoded");
  EXPECT_EQ(check(Value(img, {.dtype = DType::kBFloat16})).message(),
            "the shared tier's value has dtype bfloat16, this tower's is float32; refused and re-encoded");
  EXPECT_EQ(check(Value(img, {.deepstack_layers = 3})).message(),
            "the shared tier's value has deepstack layers 3, this tower has 2; refused and re-encoded");
  Embedding cut = Value(img);
  cut.main.resize(cut.main.size() - 4);
  EXPECT_EQ(check(cut).message(),
            "the shared tier's value holds 380 bytes, its shape needs 384; refused and re-encoded");
  Embedding nan = Value(img);
  PutFloat(nan.main, 5, std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(check(nan).message(), "the shared tier's value holds non-finite rows (NaN or Inf); refused and re-encoded");
  Embedding inf = Value(img);
  PutFloat(inf.deepstack, inf.deepstack.size() / 4 - 1, -std::numeric_limits<float>::infinity());
  EXPECT_FALSE(check(inf).ok());
}

TEST(CheckAdoptedValue, FindsNonFiniteHalfPrecisionElements) {
  const FakeTower tower({.dtype = DType::kBFloat16});
  const std::string img = Png(56, 56, 6);
  Embedding e = Value(img, {.dtype = DType::kBFloat16});
  ASSERT_TRUE(CheckAdoptedValue(e, {4, GridTHW{1, 4, 4}}, tower, 2).ok());
  const std::uint16_t bf16_nan = 0x7fc0;  // sign 0, exponent all ones, mantissa non-zero
  std::memcpy(e.main.data() + 7 * sizeof(bf16_nan), &bf16_nan, sizeof(bf16_nan));  // element 7
  EXPECT_FALSE(CheckAdoptedValue(e, {4, GridTHW{1, 4, 4}}, tower, 2).ok());
}

TEST_F(WorkerCostTest, ReadyValuesThatBreakAPredictionAreRefusedAndReencoded) {
  auto w = Make();
  Embedding grid = Value(Png(56, 56, 7));
  grid.grid = {1, 2, 8};
  ExpectReadyRefused(*w, Png(56, 56, 7), grid,
                     "the shared tier's value has grid (1, 2, 8), the image's header gives (1, 4, 4); refused and "
                     "re-encoded",
                     1);
  EXPECT_EQ(state_->items_encoded(), 1);
  Embedding nan = Value(Png(56, 56, 8));
  PutFloat(nan.main, 0, std::numeric_limits<float>::quiet_NaN());
  ExpectReadyRefused(*w, Png(56, 56, 8), nan,
                     "the shared tier's value holds non-finite rows (NaN or Inf); refused and re-encoded", 2);
  EXPECT_EQ(state_->items_encoded(), 2);
  // Neither is a shape mismatch: both had the right rows, width and dtype.
  EXPECT_EQ(w->stats().shape_mismatches, 0u);
}

TEST_F(WorkerCostTest, AGoodReadyValueIsAdoptedWithItsCost) {
  auto w = Make();
  const std::string img = Png(56, 56, 9);
  ASSERT_TRUE(SubmitWithL3Value(*w, Request("r", {img}), "r", Value(img), 0.125).ok());
  EXPECT_EQ(c_.done["r"].items[0].source, ItemSource::kL3);
  // The result carries the cost the shared tier stored (replay's manifest
  // writes it as cost_s).
  EXPECT_EQ(c_.done["r"].items[0].encode_seconds, 0.125);
  EXPECT_TRUE(w->TakeRefused().empty());
  WorkerStats s = w->stats();
  EXPECT_EQ(s.hit_seconds_l3, 0.125);
  EXPECT_EQ(s.hit_bytes_l3, Value(img).nbytes());
  // Cached with that cost: its L1 hit saves the same.
  ASSERT_TRUE(Run(*w, "h", {img}).all_ok());
  EXPECT_EQ(w->stats().hit_seconds_l1, 0.125);
  EXPECT_EQ(w->stats().encode_seconds_saved, 0.25);
  EXPECT_EQ(state_->items_encoded(), 0);
}

TEST_F(WorkerCostTest, AReadyValueWithoutACostLeavesTheResultUnmeasured) {
  auto w = Make();
  const std::string img = Png(56, 56, 10);
  ASSERT_TRUE(
      SubmitWithL3Value(*w, Request("r", {img}), "r", Value(img), std::numeric_limits<double>::quiet_NaN()).ok());
  EXPECT_EQ(c_.done["r"].items[0].source, ItemSource::kL3);
  EXPECT_EQ(c_.done["r"].items[0].encode_seconds, -1);
}

}  // namespace
}  // namespace epd
