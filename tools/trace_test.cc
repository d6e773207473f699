#include "trace.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>

namespace epd::cli {
namespace {

TEST(TraceTest, ParsesRequestsWithDefaults) {
  auto t = ParseTrace(
      "{\"id\": \"r1\", \"arrival_ms\": 12.5, \"images\": [\"a.jpg\", \"b.png\"]}\n"
      "\n"
      "{\"images\": [\"a.jpg\"]}\n",
      "t.jsonl");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_EQ(t->size(), 2u);
  EXPECT_EQ((*t)[0].id, "r1");
  EXPECT_EQ((*t)[0].arrival_ms, 12.5);
  EXPECT_EQ((*t)[0].images, (std::vector<std::string>{"a.jpg", "b.png"}));
  EXPECT_EQ((*t)[1].id, "line-3");
  EXPECT_EQ((*t)[1].arrival_ms, 0);
}

TEST(TraceTest, ErrorsNameTheLine) {
  const std::map<std::string, std::string> bad = {
      {"{\"images\": [\"a\"]}\nnot json\n", "t.jsonl:2: not valid JSON"},
      {"[1]\n", "t.jsonl:1: expected a JSON object"},
      {"{\"images\": []}\n", "t.jsonl:1: images must be a non-empty array of strings"},
      {"{\"images\": [3]}\n", "t.jsonl:1: images must be a non-empty array of strings"},
      {"{\"videos\": [\"\"]}\n", "t.jsonl:1: videos must be an array of non-empty strings"},
      {"{\"images\": [], \"videos\": []}\n", "t.jsonl:1: images must be a non-empty array of strings"},
      {"{\"images\": [\"a\"], \"arrival_ms\": -1}\n", "t.jsonl:1: arrival_ms must be a number >= 0"},
      {"{\"id\": \"x\", \"images\": [\"a\"]}\n{\"id\": \"x\", \"images\": [\"b\"]}\n",
       "t.jsonl:2: duplicate request id 'x'"},
  };
  for (const auto& [text, message] : bad) {
    auto t = ParseTrace(text, "t.jsonl");
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(t.status().message(), message);
  }
}

// Issue 27, fault 9: --realtime waited start + arrival_ms in int64
// nanoseconds; 9.3e12 ms overflowed it and the request went at once.
TEST(TraceTest, AnArrivalThatWouldOverflowTheRealtimeClockIsRefusedNamingTheLine) {
  for (const char* arrival : {"9.3e12", "9223372036855", "1e300", "9000000000000"}) {
    const std::string text =
        std::string("{\"images\": [\"a\"]}\n{\"images\": [\"a\"], \"arrival_ms\": ") + arrival + "}\n";
    auto t = ParseTrace(text, "t.jsonl");
    ASSERT_FALSE(t.ok()) << arrival;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(t.status().message().rfind("t.jsonl:2: arrival_ms ", 0), 0u) << t.status().message();
    EXPECT_NE(t.status().message().find("not below 9000000000000"), std::string::npos) << t.status().message();
  }
  auto ok = ParseTrace("{\"images\": [\"a\"], \"arrival_ms\": 8999999999999}\n", "t.jsonl");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ((*ok)[0].arrival_ms, 8999999999999.0);
}

// A fresh directory under the test's temp dir, removed at the end.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "epd-trace-XXXXXX").string();
    path = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// Issue 27, fault 9: a trace naming /dev/zero grew RSS to 20 GB, a FIFO hung
// for ever. Only regular files under the size limit are read.
TEST(TraceTest, OnlyARegularFileUnderTheLimitIsReadAsATrace) {
  auto null = ReadTrace("/dev/null");  // was read as an empty trace
  ASSERT_FALSE(null.ok());
  EXPECT_EQ(null.status().message(),
            "cannot read trace /dev/null: /dev/null is a character device, not a regular file: only files are read");
  auto zero = ReadRegularFile("/dev/zero", kDefaultMaxRequestBytes);
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("a character device"), std::string::npos) << zero.status().message();

  TempDir dir;
  auto is_dir = ReadTrace(dir.path.string());
  ASSERT_FALSE(is_dir.ok());
  EXPECT_NE(is_dir.status().message().find("is a directory"), std::string::npos) << is_dir.status().message();

  const std::string big = (dir.path / "big.jsonl").string();
  {
    std::ofstream f(big);
    f << std::string(1001, ' ');
  }
  auto over = ReadTrace(big, 1000);
  ASSERT_FALSE(over.ok());
  EXPECT_NE(over.status().message().find("is 1001 bytes"), std::string::npos) << over.status().message();
  EXPECT_NE(over.status().message().find("over the limit of 1000 bytes"), std::string::npos);
  EXPECT_TRUE(ReadTrace(big, 1001).ok());  // blank lines only: an empty trace

  EXPECT_EQ(ReadTrace((dir.path / "missing.jsonl").string()).status().code(), StatusCode::kInvalidArgument);
}

TEST(TraceTest, AFifoIsRefusedAtOnceInsteadOfWaitingForAWriter) {
  TempDir dir;
  const std::string fifo = (dir.path / "trace.fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto read = std::async(std::launch::async, [&] { return ReadTrace(fifo); });
  const bool returned = read.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
  if (!returned) {  // the old blocking open: give it a writer so the test ends
    const int w = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (w >= 0) ::close(w);
  }
  auto t = read.get();
  ASSERT_TRUE(returned) << "ReadTrace waited for a writer on a FIFO";
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("is a FIFO, not a regular file"), std::string::npos) << t.status().message();
}

TEST(TraceTest, JsonLinesRoundTrip) {
  std::vector<TraceRequest> t = {{"a", 1.5, {"x.png", "y.png"}, {}}, {"b", 0, {"x.png"}, {}}};
  auto back = ParseTrace(TraceToJsonLines(t), "rt");
  ASSERT_TRUE(back.ok());
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ((*back)[0].id, "a");
  EXPECT_EQ((*back)[0].arrival_ms, 1.5);
  EXPECT_EQ((*back)[0].images, t[0].images);
  EXPECT_EQ((*back)[1].images, t[1].images);
}

TEST(TraceTest, VideosAreItemsAfterTheImages) {
  auto t = ParseTrace(
      "{\"id\": \"v\", \"images\": [\"a.png\"], \"videos\": [\"c.mp4\", \"d.webm\"]}\n"
      "{\"id\": \"w\", \"videos\": [\"c.mp4\"]}\n",
      "t.jsonl");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  const TraceRequest& v = (*t)[0];
  EXPECT_EQ(v.paths(), (std::vector<std::string>{"a.png", "c.mp4", "d.webm"}));
  EXPECT_FALSE(v.is_video(0));
  EXPECT_TRUE(v.is_video(1));
  EXPECT_TRUE(v.is_video(2));
  EXPECT_TRUE((*t)[1].images.empty());
  auto back = ParseTrace(TraceToJsonLines(*t), "rt");
  ASSERT_TRUE(back.ok());
  EXPECT_EQ((*back)[0].videos, v.videos);
  EXPECT_EQ((*back)[1].videos, (std::vector<std::string>{"c.mp4"}));
}

TEST(TraceTest, GeneratorIsDeterministicAndFollowsItsBounds) {
  const std::vector<std::string> images = {"a", "b", "c", "d", "e", "f", "g", "h"};
  GeneratorOptions o;
  o.requests = 2000;
  o.seed = 7;
  o.rate_per_s = 50;
  const auto t1 = GenerateTrace(images, o);
  const auto t2 = GenerateTrace(images, o);
  ASSERT_EQ(t1.size(), 2000u);
  EXPECT_EQ(TraceToJsonLines(t1), TraceToJsonLines(t2));
  o.seed = 8;
  EXPECT_NE(TraceToJsonLines(GenerateTrace(images, o)), TraceToJsonLines(t1));

  EXPECT_EQ(t1[0].id, "gen-000001");
  EXPECT_EQ(t1[1999].id, "gen-002000");
  EXPECT_EQ(t1[10].arrival_ms, 200.0);  // 10 * 1000 / 50
  std::map<std::string, int> count;
  std::map<std::size_t, int> sizes;
  for (const TraceRequest& r : t1) {
    ++sizes[r.images.size()];
    for (const std::string& i : r.images) ++count[i];
  }
  EXPECT_EQ(sizes.size(), 4u);  // 1, 2, 3 and 4 images all occur
  EXPECT_EQ(sizes.begin()->first, 1u);
  EXPECT_EQ(sizes.rbegin()->first, 4u);
  // Zipf(1): rank 1 is drawn about twice as often as rank 2 and 8 times as
  // often as rank 8 (5000 draws; generous bounds).
  EXPECT_GT(count["a"], count["b"]);
  EXPECT_GT(count["b"], count["h"]);
  EXPECT_NEAR(static_cast<double>(count["a"]) / count["b"], 2.0, 0.3);
  EXPECT_NEAR(static_cast<double>(count["a"]) / count["h"], 8.0, 2.0);
}

TEST(TraceTest, ZipfZeroIsUniform) {
  GeneratorOptions o;
  o.requests = 4000;
  o.zipf_s = 0;
  o.min_images = o.max_images = 1;
  std::map<std::string, int> count;
  for (const TraceRequest& r : GenerateTrace({"a", "b", "c", "d"}, o)) ++count[r.images[0]];
  for (const auto& [name, c] : count) EXPECT_NEAR(c, 1000, 120) << name;
}

}  // namespace
}  // namespace epd::cli
