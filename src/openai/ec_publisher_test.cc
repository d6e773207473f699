// EcPublisher on real files in a temporary directory: the one-tensor layout
// (main rows, then each row's deepstack levels), no rewrite of a complete
// file, unsafe ids, a write that fails, atomic publication under 200
// concurrent publishes watched by a polling reader, and the bound's
// oldest-first eviction with its grace (an injected clock).
#include "epd/openai/ec_publisher.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

namespace epd {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  TempDir() {
    char tmpl[] = "/tmp/ec_publisher_test.XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string path;
};

// tokens x hidden floats main[r][c] = base + r * 100 + c, and `layers`
// deepstack levels deep[r][l * hidden + c] = base + 10000 * (l + 1) + r * 100 + c.
Embedding Rows(std::int64_t tokens, std::int64_t hidden, std::int64_t layers, float base) {
  Embedding e;
  e.tokens = tokens;
  e.hidden = hidden;
  e.deepstack_layers = layers;
  e.dtype = DType::kFloat32;
  e.grid = GridTHW{1, 2, 2};
  std::vector<float> main, deep;
  for (std::int64_t r = 0; r < tokens; ++r) {
    for (std::int64_t c = 0; c < hidden; ++c) main.push_back(base + static_cast<float>(r * 100 + c));
    for (std::int64_t l = 0; l < layers; ++l) {
      for (std::int64_t c = 0; c < hidden; ++c)
        deep.push_back(base + static_cast<float>(10000 * (l + 1) + r * 100 + c));
    }
  }
  e.main.resize(main.size() * 4);
  std::memcpy(e.main.data(), main.data(), e.main.size());
  e.deepstack.resize(deep.size() * 4);
  std::memcpy(e.deepstack.data(), deep.data(), e.deepstack.size());
  return e;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The safetensors header of `bytes` (its JSON text) and where data starts.
std::string Header(const std::string& bytes, std::size_t* data_at) {
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  *data_at = 8 + n;
  return bytes.substr(8, n);
}

std::unique_ptr<EcPublisher> OpenOrDie(EcPublisherOptions o) {
  auto p = EcPublisher::Open(std::move(o));
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p.ok() ? std::move(*p) : nullptr;
}

TEST(EcPublisherTest, OneEcCacheTensorHoldsEachMainRowThenItsDeepstackLevels) {
  TempDir d;
  auto p = OpenOrDie({d.path});
  ASSERT_TRUE(p->Publish("item-1", Rows(3, 2, 2, 0.5f)).ok());
  const std::string bytes = Slurp(d.path + "/item-1/encoder_cache.safetensors");
  std::size_t at = 0;
  const std::string header = Header(bytes, &at);
  EXPECT_NE(header.find("\"ec_cache\":{\"data_offsets\":[0,72],\"dtype\":\"F32\",\"shape\":[3,6]}"), std::string::npos)
      << header;
  EXPECT_EQ(header.find("grid"), std::string::npos);  // exactly one tensor
  ASSERT_EQ(bytes.size(), at + 72);
  std::vector<float> got(18);
  std::memcpy(got.data(), bytes.data() + at, 72);
  const std::vector<float> want = {0.5f,   1.5f,   10000.5f, 10001.5f, 20000.5f, 20001.5f,
                                   100.5f, 101.5f, 10100.5f, 10101.5f, 20100.5f, 20101.5f,
                                   200.5f, 201.5f, 10200.5f, 10201.5f, 20200.5f, 20201.5f};
  EXPECT_EQ(got, want);
  EXPECT_EQ(p->Stats().published, 1u);
}

TEST(EcPublisherTest, ACompleteFileIsNotRewritten) {
  TempDir d;
  auto p = OpenOrDie({d.path});
  ASSERT_EQ(*p->Publish("same", Rows(2, 2, 0, 1.0f)), EcOutcome::kWritten);
  const std::string first = Slurp(p->PathOf("same"));
  StatusOr<EcOutcome> again = p->Publish("same", Rows(2, 2, 0, 7.0f));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, EcOutcome::kPresent);
  EXPECT_EQ(Slurp(p->PathOf("same")), first);
  EXPECT_EQ(p->Stats().already_present, 1u);
  EXPECT_EQ(p->Stats().files, 1);
}

TEST(EcPublisherTest, IdsUnsafeInAPathAreRefused) {
  for (const char* bad : {"../x", "a/b", ".hidden", "", "..", "a b", "x\n"}) {
    const Status s = EcPublisher::CheckId(bad);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(EcPublisher::CheckId(std::string(256, 'a')).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(EcPublisher::CheckId("Ok-id_1.2").ok());
  EXPECT_TRUE(EcPublisher::CheckId(std::string(255, 'a')).ok());
  TempDir d;
  auto p = OpenOrDie({d.path});
  EXPECT_EQ(p->Publish("../escape", Rows(1, 1, 0, 0)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(fs::path(d.path).parent_path() / "escape"));
}

TEST(EcPublisherTest, AWriteThatFailsIsNamedAndLeavesThePublisherWorking) {
  TempDir d;
  auto p = OpenOrDie({d.path});
  std::ofstream(d.path + "/blocked") << "a file where the id's directory should be";
  StatusOr<EcOutcome> failed = p->Publish("blocked", Rows(2, 2, 0, 0));
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), StatusCode::kInternal);
  EXPECT_EQ(failed.status().message().rfind("ec_dir_write_failed: cannot write " + d.path + "/blocked", 0), 0u)
      << failed.status().message();
  EXPECT_NE(failed.status().message().find("Not a directory"), std::string::npos);
  EXPECT_EQ(p->Stats().write_failures, 1u);
  EXPECT_TRUE(p->Publish("fine", Rows(2, 2, 0, 0)).ok());
  EXPECT_EQ(p->Stats().files, 1);
}

// 8 threads publish 200 times over 120 ids (some ids by several threads at
// once); a reader lists and opens every file it sees, all along, and checks
// that each is whole: header length + data offsets == the file's size,
// and the size is the one its id's rows make.
TEST(EcPublisherTest, APollingReaderNeverSeesAPartialFileDuring200ConcurrentPublishes) {
  TempDir d;
  auto p = OpenOrDie({d.path});
  std::atomic<bool> done{false}, reading{false};
  std::atomic<int> opened{0}, bad{0};
  constexpr std::int64_t kHidden = 2048;  // 8 KiB a row: writes take long enough to be seen mid-way
  std::thread reader([&] {
    for (bool last = false; !last;) {
      last = done.load();  // one more pass after the writers are done
      reading = true;
      for (const auto& sub : fs::directory_iterator(d.path)) {
        const fs::path f = sub.path() / "encoder_cache.safetensors";
        if (!fs::exists(f)) continue;
        const std::string bytes = Slurp(f.string());
        std::size_t at = 0;
        const std::string header = bytes.size() >= 8 ? Header(bytes, &at) : "";
        const int tokens = 1 + std::stoi(sub.path().filename().string().substr(3)) % 5;
        const std::size_t want = static_cast<std::size_t>(tokens) * kHidden * 4;
        const bool whole = bytes.size() >= 8 && at + want == bytes.size() &&
                           header.find("[0," + std::to_string(want) + "]") != std::string::npos;
        ++opened;
        if (!whole) ++bad;
      }
    }
  });
  std::vector<std::thread> writers;
  writers.reserve(8);
  std::atomic<int> failures{0};
  while (!reading) std::this_thread::yield();
  for (int t = 0; t < 8; ++t) {
    writers.emplace_back([&, t] {
      for (int i = 0; i < 25; ++i) {
        const int id = (t * 25 + i) % 120;
        if (!p->Publish("id-" + std::to_string(id), Rows(1 + id % 5, kHidden, 0, static_cast<float>(id))).ok()) {
          ++failures;
        }
      }
    });
  }
  for (std::thread& w : writers) w.join();
  done = true;
  reader.join();
  EXPECT_EQ(failures, 0);
  EXPECT_EQ(bad, 0) << "of " << opened << " files opened";
  EXPECT_GE(opened, 120);  // at least the final pass's
  const EcPublisherStats s = p->Stats();
  EXPECT_EQ(s.published, 120u);
  EXPECT_EQ(s.published + s.already_present, 200u);
  for (const auto& sub : fs::directory_iterator(d.path)) {
    for (const auto& f : fs::directory_iterator(sub.path()))
      EXPECT_EQ(f.path().filename(), "encoder_cache.safetensors");
  }
}

TEST(EcPublisherTest, TheBoundDeletesOldestFirstButNothingWithinTheGrace) {
  TempDir d;
  auto clock = std::make_shared<std::chrono::system_clock::time_point>(std::chrono::system_clock::now());
  auto at = [&](int s) {
    *clock = std::chrono::system_clock::time_point() + std::chrono::hours(500000) + std::chrono::seconds(s);
  };
  at(0);
  const Embedding rows = Rows(4, 8, 0, 0);  // 128 data bytes, about 210 on disk
  auto probe = OpenOrDie({d.path + "/probe"});
  ASSERT_TRUE(probe->Publish("x", rows).ok());
  const std::int64_t file = probe->Stats().bytes;
  EcPublisherOptions o{d.path + "/ec", file * 5 / 2, std::chrono::seconds(10), [clock] { return *clock; }};
  auto p = OpenOrDie(o);
  const auto present = [&](const char* id) { return fs::exists(p->PathOf(id)); };
  at(0);
  ASSERT_TRUE(p->Publish("a", rows).ok());
  at(20);
  ASSERT_TRUE(p->Publish("b", rows).ok());
  at(40);
  ASSERT_TRUE(p->Publish("c", rows).ok());  // 3 > 2.5: a (40 s old) goes
  EXPECT_FALSE(present("a"));
  EXPECT_TRUE(present("b") && present("c"));
  at(45);
  ASSERT_TRUE(p->Publish("b", rows).ok());  // re-requested: b is now the newest
  at(46);
  ASSERT_TRUE(p->Publish("d", rows).ok());  // c (6 s) and b (1 s) are within the grace
  EXPECT_TRUE(present("b") && present("c") && present("d"));
  EXPECT_EQ(p->Stats().over_budget, 1u);
  at(60);
  ASSERT_TRUE(p->Publish("e", rows).ok());  // oldest first: c (20 s), then b (15 s); then 2 <= 2.5
  EXPECT_FALSE(present("c"));
  EXPECT_FALSE(present("b"));
  EXPECT_TRUE(present("d") && present("e"));
  const EcPublisherStats s = p->Stats();
  EXPECT_EQ(s.evicted, 3u);
  EXPECT_EQ(s.files, 2);
  EXPECT_LE(s.bytes, o.max_bytes);
  EXPECT_EQ(s.evicted_bytes, static_cast<std::uint64_t>(3 * file));
  EXPECT_FALSE(fs::exists(d.path + "/ec/a"));  // the id's directory went too
}

TEST(EcPublisherTest, OpenKnowsTheFilesAlreadyThereAndDropsStaleTemporaries) {
  TempDir d;
  {
    auto p = OpenOrDie({d.path});
    ASSERT_TRUE(p->Publish("old", Rows(2, 2, 0, 0)).ok());
  }
  const std::string stale = d.path + "/old/.encoder_cache.safetensors.tmp-1-1";
  std::ofstream(stale) << "half a file";
  const timespec long_ago[2] = {{1000, 0}, {1000, 0}};
  utimensat(AT_FDCWD, stale.c_str(), long_ago, 0);
  auto p = OpenOrDie({d.path, 0, std::chrono::seconds(30), nullptr});
  EXPECT_EQ(p->Stats().files, 1);
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_EQ(*p->Publish("old", Rows(2, 2, 0, 0)), EcOutcome::kPresent);
}

}  // namespace
}  // namespace epd
