#include "replay_manifest.h"

#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace epd::cli {
namespace {

ContentKey Key(std::uint8_t fill) {
  ContentKey k;
  k.bytes.fill(fill);
  return k;
}

ItemResult Served(std::int64_t index, std::uint8_t key, GridTHW grid, std::int64_t tokens, ItemSource source) {
  auto e = std::make_shared<Embedding>();
  e->tokens = tokens;
  e->hidden = 1;
  e->grid = grid;
  e->main.resize(static_cast<std::size_t>(tokens) * 4);
  ItemResult r;
  r.index = index;
  r.key = Key(key);
  r.embedding = e;
  r.source = source;
  return r;
}

TEST(ReplayManifestTest, OneLinePerItemNamingKeyGridAndFile) {
  const std::vector<TraceRequest> trace = {{"r1", 0, {"a.png", "b.png"}, {}}, {"r2", 5, {"a.png"}, {}}};
  std::vector<RequestResult> results(2);
  results[0].id = "r1";
  results[0].items = {Served(0, 0xaa, {1, 4, 6}, 6, ItemSource::kMiss),
                      Served(1, 0xbb, {2, 2, 2}, 2, ItemSource::kMiss)};
  results[1].id = "r2";
  results[1].items = {Served(0, 0xaa, {1, 4, 6}, 6, ItemSource::kL1)};
  const std::string a(64, 'a'), b(64, 'b');
  // Written out by hand, in the documented field order.
  const std::string want =
      "{\"request\":\"r1\",\"item\":0,\"media\":\"a.png\",\"key\":\"" + a +
      "\",\"grid_thw\":[1,4,6],\"tokens\":6,\"bytes\":24,\"source\":\"miss\",\"file\":\"out/emb.safetensors\"}\n"
      "{\"request\":\"r1\",\"item\":1,\"media\":\"b.png\",\"key\":\"" +
      b +
      "\",\"grid_thw\":[2,2,2],\"tokens\":2,\"bytes\":8,\"source\":\"miss\",\"file\":\"out/emb.safetensors\"}\n"
      "{\"request\":\"r2\",\"item\":0,\"media\":\"a.png\",\"key\":\"" +
      a + "\",\"grid_thw\":[1,4,6],\"tokens\":6,\"bytes\":24,\"source\":\"l1\",\"file\":\"out/emb.safetensors\"}\n";
  EXPECT_EQ(ReplayManifestJsonLines(trace, results, "out/emb.safetensors"), want);
}

TEST(ReplayManifestTest, FailedItemsCarryTheirErrorAndAKeyOnlyWhenDerived) {
  const std::vector<TraceRequest> trace = {{"r1", 0, {"bad.png", "ok.png"}, {}}, {"r2", 0, {"c.png"}, {}}};
  std::vector<RequestResult> results(2);
  results[0].items.resize(2);
  results[0].items[0].index = 0;
  results[0].items[0].key = Key(0x01);
  results[0].items[0].status = InvalidArgument("item 0: not an image");
  results[0].items[1] = Served(1, 0x02, {}, 3, ItemSource::kMiss);                   // grid unknown: no grid_thw
  results[1].status = Status(StatusCode::kCancelled, "request 'r2' was cancelled");  // no items delivered
  const std::string text = ReplayManifestJsonLines(trace, results, "e.safetensors");
  std::string key01;
  for (int i = 0; i < 32; ++i) key01 += "01";
  std::string key02;
  for (int i = 0; i < 32; ++i) key02 += "02";
  EXPECT_EQ(text, "{\"request\":\"r1\",\"item\":0,\"media\":\"bad.png\",\"key\":\"" + key01 +
                      "\",\"error\":\"INVALID_ARGUMENT: item 0: not an image\"}\n"
                      "{\"request\":\"r1\",\"item\":1,\"media\":\"ok.png\",\"key\":\"" +
                      key02 +
                      "\",\"tokens\":3,\"bytes\":12,\"source\":\"miss\",\"file\":\"e.safetensors\"}\n"
                      "{\"request\":\"r2\",\"item\":0,\"media\":\"c.png\",\"error\":\"CANCELLED: request 'r2' was "
                      "cancelled\"}\n");
}

// The tower's item carries its measured cost; a later hit and an earlier
// join of the same image carry it too; an image the tower never ran for in
// this replay (an L3 adoption) has none.
TEST(ReplayManifestTest, EachImageCarriesTheCostMeasuredWhereTheTowerRanIt) {
  const std::vector<TraceRequest> trace = {
      {"r1", 0, {"a.png"}, {}}, {"r2", 0, {"a.png", "c.png"}, {}}, {"r3", 0, {"a.png"}, {}}};
  std::vector<RequestResult> results(3);
  results[0].items = {Served(0, 0xaa, {1, 4, 6}, 6, ItemSource::kJoined)};
  results[1].items = {Served(0, 0xaa, {1, 4, 6}, 6, ItemSource::kMiss), Served(1, 0xcc, {}, 2, ItemSource::kL2)};
  results[1].items[0].encode_seconds = 0.25;
  results[2].items = {Served(0, 0xaa, {1, 4, 6}, 6, ItemSource::kL1)};
  const std::string text = ReplayManifestJsonLines(trace, results, "e.safetensors");
  std::vector<nlohmann::json> lines;
  for (std::size_t at = 0, end; (end = text.find('\n', at)) != std::string::npos; at = end + 1) {
    lines.push_back(nlohmann::json::parse(text.substr(at, end - at)));
  }
  ASSERT_EQ(lines.size(), 4u);
  for (std::size_t i : {0u, 1u, 3u}) {
    EXPECT_EQ(lines[i]["bytes"], 24) << i;
    EXPECT_EQ(lines[i]["cost_s"], 0.25) << i;
  }
  EXPECT_EQ(lines[2]["bytes"], 8);
  EXPECT_FALSE(lines[2].contains("cost_s"));
}

TEST(ReplayManifestTest, ManifestSitsBesideTheOutputFile) {
  EXPECT_EQ(ManifestPathFor("out/emb.safetensors"), "out/emb.manifest.jsonl");
  EXPECT_EQ(ManifestPathFor("emb.bin"), "emb.bin.manifest.jsonl");
  EXPECT_EQ(ManifestPathFor(".safetensors"), ".safetensors.manifest.jsonl");
}

}  // namespace
}  // namespace epd::cli
