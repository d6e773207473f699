// EcPublisher on real files in a temporary directory: the one-tensor layout
// (main rows, then each row's deepstack levels) and the key it records, no
// rewrite of a file that records the same key and an atomic rewrite of one
// that does not (B63), tenants' own directories (B62), any uuid accepted
// and unsafe ones mapped (B71), a write that fails, atomic publication
// under 200 concurrent publishes watched by a polling reader, and the
// bound's oldest-first eviction with its grace (an injected clock). The
// ec-dir's hostile contents (symlinks, FIFOs), modes and failed publishes
// are ec_publisher_safety_test.cc.
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

#include "ec_publisher_test_util.h"

namespace epd {
namespace {

namespace fs = std::filesystem;
using ec_test::MainRows;
using ec_test::OpenOrDie;
using ec_test::Read;
using ec_test::Rows;
using ec_test::Slurp;
using ec_test::TempDir;

// The safetensors header of `bytes` (its JSON text) and where data starts.
std::string Header(const std::string& bytes, std::size_t* data_at) {
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  *data_at = 8 + n;
  return bytes.substr(8, n);
}

TEST(EcPublisherTest, OneEcCacheTensorHoldsEachMainRowThenItsDeepstackLevels) {
  TempDir d;
  auto p = OpenOrDie({d.path});
  ASSERT_TRUE(p->Publish({"item-1", "key-1"}, Rows(3, 2, 2, 0.5f)).ok());
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
  // The key it was made from, where vLLM's load_file does not look.
  EXPECT_EQ(Read(p->PathOf("item-1")).metadata, (std::map<std::string, std::string>{{"epd_content_key", "key-1"}}));
  EXPECT_EQ(p->Stats().published, 1u);
}

TEST(EcPublisherTest, AFileThatRecordsTheSameKeyIsRenewedNotRewritten) {
  TempDir d;
  auto p = OpenOrDie({d.path});
  ASSERT_EQ(*p->Publish({"same", "k"}, Rows(2, 2, 0, 1.0f)), EcOutcome::kWritten);
  const std::string first = Slurp(p->PathOf("same"));
  StatusOr<EcOutcome> again = p->Publish({"same", "k"}, Rows(2, 2, 0, 7.0f));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, EcOutcome::kPresent);
  EXPECT_EQ(Slurp(p->PathOf("same")), first);
  EXPECT_EQ(p->Stats().already_present, 1u);
  EXPECT_EQ(p->Stats().files, 1);
}

// B63: the proxy names an item sha256(url); the bytes behind the URL
// changed, so the same id comes with another key and other rows. The old
// file (4 rows) was kept while the reply gave the new grid.
TEST(EcPublisherTest, StaleByUrlTheSameIdWithAnotherKeyIsRewrittenWithTheNewRows) {
  TempDir d;
  auto p = OpenOrDie({d.path});
  ASSERT_EQ(*p->Publish({"url-hash", "old-key"}, Rows(4, 3, 0, 1.0f)), EcOutcome::kWritten);
  StatusOr<EcOutcome> again = p->Publish({"url-hash", "new-key"}, Rows(6, 3, 0, 50.0f));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(*again, EcOutcome::kWritten);
  const ec_test::ReadBack got = Read(p->PathOf("url-hash"));
  EXPECT_EQ(got.shape, (std::vector<std::int64_t>{6, 3}));
  EXPECT_EQ(got.rows, MainRows(6, 3, 50.0f));
  EXPECT_EQ(got.metadata.at("epd_content_key"), "new-key");
  const EcPublisherStats s = p->Stats();
  EXPECT_EQ(s.published, 2u);
  EXPECT_EQ(s.files, 1);
  EXPECT_EQ(s.bytes, static_cast<std::int64_t>(fs::file_size(p->PathOf("url-hash"))));
  for (const auto& f : fs::directory_iterator(d.path + "/url-hash"))  // no temporary left
    EXPECT_EQ(f.path().filename(), "encoder_cache.safetensors");
}

// B62: tenant B published its own image under the uuid A's proxy sends for
// A's URL; A then got 200 and its prefill loaded B's rows.
TEST(EcPublisherTest, CrossTenantUuidATenantNeverGetsAnotherTenantsFile) {
  TempDir d;
  auto p = OpenOrDie({d.path});
  ASSERT_EQ(*p->Publish({"shared-uuid", "tenant-b-key", "bob"}, Rows(2, 2, 0, 900.0f)), EcOutcome::kWritten);
  StatusOr<EcOutcome> a = p->Publish({"shared-uuid", "tenant-a-key", "alice"}, Rows(3, 2, 0, 1.0f));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(*a, EcOutcome::kWritten);
  EXPECT_EQ(p->PathOf("shared-uuid", "alice"), d.path + "/tenant=alice/shared-uuid/encoder_cache.safetensors");
  EXPECT_EQ(Read(p->PathOf("shared-uuid", "alice")).rows, MainRows(3, 2, 1.0f));
  EXPECT_EQ(Read(p->PathOf("shared-uuid", "bob")).rows, MainRows(2, 2, 900.0f));  // B's file is B's still
  EXPECT_FALSE(fs::exists(d.path + "/shared-uuid"));                              // nothing in the shared namespace
  // Even in one namespace, a file made from another key is never present.
  ASSERT_EQ(*p->Publish({"u", "tenant-b-key"}, Rows(2, 2, 0, 900.0f)), EcOutcome::kWritten);
  ASSERT_EQ(*p->Publish({"u", "tenant-a-key"}, Rows(3, 2, 0, 1.0f)), EcOutcome::kWritten);
  EXPECT_EQ(Read(p->PathOf("u")).rows, MainRows(3, 2, 1.0f));
  // A tenant name unsafe in a path is mapped, and the files are found again at Open.
  EXPECT_EQ(EcPublisher::TenantDir("tenant:x"),
            "tenant=sha256=e23bce5b82b43b7908019054a148ad9b9ea7ca37be43d5c69961b6bd03c1698b");
  EXPECT_EQ(EcPublisher::TenantDir(""), "");
  p.reset();
  EXPECT_EQ(OpenOrDie({d.path})->Stats().files, 3);
}

// B71: vLLM accepts any uuid; those unsafe in a path were refused with 400.
TEST(EcPublisherTest, AnyUuidIsAcceptedAndOnesUnsafeInAPathAreMapped) {
  const std::map<std::string, std::string> want = {
      {"user:42", "sha256=ea3fd43be1e57d62e163dae19fc740bd6d660eec497235fd0ef859e2bd9fa328"},
      {"a:b@c", "sha256=c0cd6415fabd224929f90c56025c75c35de8307c3aaab73d04dd1c5828aa7fc2"},
      {"../escape", "sha256=1ba7343c47dc442de7dec43a995deb9a7b62234ecca16d7c6f597b5155bd85b1"},
      {"", "sha256=e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
      {"Ok-id_1.2", "Ok-id_1.2"},
      {std::string(255, 'a'), std::string(255, 'a')}};
  for (const auto& [id, name] : want) EXPECT_EQ(EcPublisher::IdName(id), name) << id;
  for (const char* other : {".hidden", "..", "a/b", "a b", "x\n", "\xe7\x94\xbb\xe5\x83\x8f", "sha256=00"}) {
    EXPECT_EQ(EcPublisher::IdName(other).substr(0, 7), "sha256=") << other;
    EXPECT_EQ(EcPublisher::IdName(other).size(), 71u) << other;
  }
  EXPECT_EQ(EcPublisher::IdName(std::string(256, 'a')).size(), 71u);
  TempDir d;
  auto p = OpenOrDie({d.path + "/ec"});
  float base = 0;
  for (const auto& [id, name] : want) {
    base += 10;
    StatusOr<EcOutcome> done = p->Publish({id, "k" + id}, Rows(1, 2, 0, base));
    ASSERT_TRUE(done.ok()) << id << ": " << done.status().ToString();
    EXPECT_EQ(p->PathOf(id), d.path + "/ec/" + name + "/encoder_cache.safetensors");
    EXPECT_EQ(Read(d.path + "/ec/" + name + "/encoder_cache.safetensors").rows, MainRows(1, 2, base)) << id;
  }
  EXPECT_FALSE(fs::exists(d.path + "/escape"));
  EXPECT_EQ(p->Stats().files, static_cast<std::int64_t>(want.size()));
}

TEST(EcPublisherTest, AWriteThatFailsIsNamedAndLeavesThePublisherWorking) {
  TempDir d;
  auto p = OpenOrDie({d.path});
  std::ofstream(d.path + "/blocked") << "a file where the id's directory should be";
  StatusOr<EcOutcome> failed = p->Publish({"blocked", "k"}, Rows(2, 2, 0, 0));
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), StatusCode::kInternal);
  EXPECT_EQ(failed.status().message().rfind("ec_dir_write_failed: cannot write " + d.path + "/blocked", 0), 0u)
      << failed.status().message();
  EXPECT_NE(failed.status().message().find("Not a directory"), std::string::npos);
  EXPECT_EQ(p->Stats().write_failures, 1u);
  EXPECT_EQ(Slurp(d.path + "/blocked"), "a file where the id's directory should be");
  EXPECT_TRUE(p->Publish({"fine", "k"}, Rows(2, 2, 0, 0)).ok());
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
        const std::string name = "id-" + std::to_string(id);
        if (!p->Publish({name, "k" + name}, Rows(1 + id % 5, kHidden, 0, static_cast<float>(id))).ok()) {
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
  ASSERT_TRUE(probe->Publish({"x", "k"}, rows).ok());
  const std::int64_t file = probe->Stats().bytes;
  EcPublisherOptions o{d.path + "/ec", file * 5 / 2, std::chrono::seconds(10), [clock] { return *clock; }};
  auto p = OpenOrDie(o);
  const auto present = [&](const char* id) { return fs::exists(p->PathOf(id)); };
  at(0);
  ASSERT_TRUE(p->Publish({"a", "k"}, rows).ok());
  at(20);
  ASSERT_TRUE(p->Publish({"b", "k"}, rows).ok());
  at(40);
  ASSERT_TRUE(p->Publish({"c", "k"}, rows).ok());  // 3 > 2.5: a (40 s old) goes
  EXPECT_FALSE(present("a"));
  EXPECT_TRUE(present("b") && present("c"));
  at(45);
  ASSERT_TRUE(p->Publish({"b", "k"}, rows).ok());  // re-requested: b is now the newest
  at(46);
  ASSERT_TRUE(p->Publish({"d", "k"}, rows).ok());  // c (6 s) and b (1 s) are within the grace
  EXPECT_TRUE(present("b") && present("c") && present("d"));
  EXPECT_EQ(p->Stats().over_budget, 1u);
  at(60);
  ASSERT_TRUE(p->Publish({"e", "k"}, rows).ok());  // oldest first: c (20 s), then b (15 s); then 2 <= 2.5
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
    ASSERT_TRUE(p->Publish({"old", "k"}, Rows(2, 2, 0, 0)).ok());
  }
  const std::string stale = d.path + "/old/.encoder_cache.safetensors.tmp-1-1";
  std::ofstream(stale) << "half a file";
  const timespec long_ago[2] = {{1000, 0}, {1000, 0}};
  utimensat(AT_FDCWD, stale.c_str(), long_ago, 0);
  auto p = OpenOrDie({d.path, 0, std::chrono::seconds(30), nullptr});
  EXPECT_EQ(p->Stats().files, 1);
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_EQ(*p->Publish({"old", "k"}, Rows(2, 2, 0, 0)), EcOutcome::kPresent);
}

}  // namespace
}  // namespace epd
