// The worker driving the real default tower (scripts/make_default_tower.py)
// through libtorch: shapes, deduplication and hits end to end.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "epd/torch_tower/torch_tower.h"
#include "epd/worker/encode_worker.h"
#include "worker_test_util.h"

namespace epd {
namespace {

using testing::Collector;
using testing::Png;
using testing::Request;

std::vector<float> Floats(const std::vector<std::byte>& b) {
  std::vector<float> f(b.size() / 4);
  std::memcpy(f.data(), b.data(), f.size() * 4);
  return f;
}

TEST(WorkerDefaultTowerTest, EncodesDeduplicatesAndServesHits) {
  TorchTowerOptions t;
  t.model_path = EPD_DEFAULT_TOWER_PATH;
  t.num_threads = 2;
  auto tower = LoadTorchScriptTower(t);
  ASSERT_TRUE(tower.ok()) << tower.status().ToString();
  const std::int64_t hidden = (*tower)->hidden();
  const std::int64_t layers = (*tower)->deepstack_layers();
  ASSERT_GT(layers, 0);

  // The same image alone, straight through the tower: the reference.
  const std::string x = Png(56, 56, 1), y = Png(84, 56, 2);  // 4 and 6 tokens
  auto pre = DecodeAndPreprocess(testing::ToBytes(x), PreprocessConfig{});
  ASSERT_TRUE(pre.ok());
  TowerItem item;
  item.patches = pre->patches.data();
  item.grid = pre->grid;
  auto alone = (*tower)->Encode({&item, 1});
  ASSERT_TRUE(alone.ok()) << alone.status().ToString();

  WorkerOptions o;
  o.model_id = "default-tower";
  auto w = EncodeWorker::Create(o, std::move(*tower));
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  Collector c;
  ASSERT_TRUE((*w)->Submit(Request("a", {x, y, x}), c.For("a")).ok());
  while ((*w)->HasQueuedWork()) (*w)->Step();

  const RequestResult& a = c.done["a"];
  ASSERT_TRUE(a.all_ok());
  const Embedding& ex = *a.items[0].embedding;
  EXPECT_EQ(ex.tokens, 4);
  EXPECT_EQ(a.items[1].embedding->tokens, 6);
  EXPECT_EQ(ex.hidden, hidden);
  EXPECT_EQ(ex.deepstack_layers, layers);
  EXPECT_EQ(ex.main.size(), static_cast<std::size_t>(4 * hidden * 4));
  EXPECT_EQ(ex.deepstack.size(), static_cast<std::size_t>(4 * hidden * layers * 4));
  EXPECT_EQ(a.items[0].embedding, a.items[2].embedding);
  EXPECT_EQ((*w)->stats().tower_items, 2u);

  // Batched with y, x's rows match x encoded alone (per-image attention); the
  // packed GEMMs may round differently, hence a tolerance.
  const std::vector<float> got = Floats(ex.main), want = Floats(alone->main);
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-4f * (1 + std::fabs(want[i]))) << i;
  const std::vector<float> got_d = Floats(ex.deepstack), want_d = Floats(alone->deepstack);
  ASSERT_EQ(got_d.size(), want_d.size());
  for (std::size_t i = 0; i < got_d.size(); ++i) {
    ASSERT_NEAR(got_d[i], want_d[i], 1e-4f * (1 + std::fabs(want_d[i]))) << i;
  }

  ASSERT_TRUE((*w)->Submit(Request("b", {x}), c.For("b")).ok());
  ASSERT_EQ(c.done.count("b"), 1u);
  EXPECT_EQ(c.done["b"].items[0].source, ItemSource::kL1);
  EXPECT_EQ(c.done["b"].items[0].embedding, a.items[0].embedding);
}

}  // namespace
}  // namespace epd
