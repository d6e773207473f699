// EcPublisher against what others can put in a shared ec-dir, and what it
// leaves there: symlinks where an id's directory or its file should be, a
// dangling link and a FIFO (never present, never followed: B66), eviction
// that stays inside the directory, files 0640 in directories 0750 in a
// chosen group, and a failed publish that leaves nothing behind (B70).
#include <fcntl.h>
#include <grp.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>

#include "ec_publisher_test_util.h"
#include "epd/openai/ec_publisher.h"

namespace epd {
namespace {

namespace fs = std::filesystem;
using ec_test::IsRegular;
using ec_test::MainRows;
using ec_test::OpenOrDie;
using ec_test::Read;
using ec_test::Rows;
using ec_test::Slurp;
using ec_test::TempDir;

constexpr char kOutsideBytes[] = "a file outside the ec-dir";

// <tmp>/ec (the ec-dir) and <tmp>/outside/encoder_cache.safetensors.
struct Planted {
  TempDir tmp;
  std::string ec = tmp.path + "/ec";
  std::string outside = tmp.path + "/outside";
  std::string outside_file = outside + "/encoder_cache.safetensors";
  Planted() {
    fs::create_directory(ec);
    fs::create_directory(outside);
    std::ofstream(outside_file) << kOutsideBytes;
  }
};

// B66: a symlink at <dir>/<id> was followed: the file it names counted as
// present, and a write went through it.
TEST(EcPublisherSafetyTest, ASymlinkAtTheIdDirectoryIsNeverFollowed) {
  Planted t;
  fs::create_directory_symlink(t.outside, t.ec + "/evil");
  auto p = OpenOrDie({t.ec});
  EXPECT_EQ(p->Stats().files, 0);  // the scan did not count the file behind it
  StatusOr<EcOutcome> done = p->Publish({"evil", "k"}, Rows(2, 2, 0, 0));
  ASSERT_FALSE(done.ok());
  EXPECT_EQ(done.status().code(), StatusCode::kInternal);
  EXPECT_EQ(done.status().message().rfind("ec_dir_write_failed: cannot write " + t.ec + "/evil", 0), 0u)
      << done.status().message();
  EXPECT_EQ(Slurp(t.outside_file), kOutsideBytes);
  EXPECT_EQ(std::distance(fs::directory_iterator(t.outside), fs::directory_iterator()), 1);  // no temporary
  EXPECT_TRUE(fs::is_symlink(t.ec + "/evil"));
}

TEST(EcPublisherSafetyTest, ASymlinkAtTheFileIsReplacedNotFollowed) {
  Planted t;
  fs::create_directory(t.ec + "/id");
  fs::create_symlink(t.outside_file, t.ec + "/id/encoder_cache.safetensors");
  auto p = OpenOrDie({t.ec});
  EXPECT_EQ(p->Stats().files, 0);
  StatusOr<EcOutcome> done = p->Publish({"id", "k"}, Rows(2, 2, 0, 5.0f));
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_EQ(*done, EcOutcome::kWritten);
  EXPECT_TRUE(IsRegular(p->PathOf("id")));
  EXPECT_EQ(Read(p->PathOf("id")).rows, MainRows(2, 2, 5.0f));
  EXPECT_EQ(Slurp(t.outside_file), kOutsideBytes);
}

TEST(EcPublisherSafetyTest, ADanglingLinkIsNeverPresent) {
  Planted t;
  fs::create_directory(t.ec + "/id");
  fs::create_symlink(t.tmp.path + "/nothing-here", t.ec + "/id/encoder_cache.safetensors");
  auto p = OpenOrDie({t.ec});
  EXPECT_EQ(p->Stats().files, 0);
  StatusOr<EcOutcome> done = p->Publish({"id", "k"}, Rows(2, 2, 0, 5.0f));
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_EQ(*done, EcOutcome::kWritten);
  EXPECT_EQ(Read(p->PathOf("id")).rows, MainRows(2, 2, 5.0f));
  EXPECT_FALSE(fs::exists(t.tmp.path + "/nothing-here"));
}

// A FIFO where the file should be: never counted, never opened so as to
// block, never present; replaced by the real file.
TEST(EcPublisherSafetyTest, AFifoInTheDirIsSkippedByTheScanAndNeverPresent) {
  Planted t;
  fs::create_directory(t.ec + "/id");
  ASSERT_EQ(mkfifo((t.ec + "/id/encoder_cache.safetensors").c_str(), 0644), 0);
  ASSERT_EQ(mkfifo((t.ec + "/fifo-id").c_str(), 0644), 0);
  auto p = OpenOrDie({t.ec});
  EXPECT_EQ(p->Stats().files, 0);
  StatusOr<EcOutcome> done = p->Publish({"id", "k"}, Rows(3, 2, 0, 8.0f));
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_EQ(*done, EcOutcome::kWritten);
  ASSERT_TRUE(IsRegular(p->PathOf("id")));  // (reading a FIFO would block)
  EXPECT_EQ(Read(p->PathOf("id")).rows, MainRows(3, 2, 8.0f));
  EXPECT_FALSE(p->Publish({"fifo-id", "k"}, Rows(1, 1, 0, 0)).ok());  // not a directory
  EXPECT_TRUE(fs::is_fifo(t.ec + "/fifo-id"));
}

// B66: eviction deleted a file outside the ec-dir, through a directory
// symlink the scan had counted.
TEST(EcPublisherSafetyTest, EvictionNeverDeletesOutsideTheDir) {
  Planted t;
  fs::create_directory_symlink(t.outside, t.ec + "/victim");
  fs::create_directory(t.ec + "/tenant=x");
  fs::create_directory_symlink(t.outside, t.ec + "/tenant=x/victim");
  fs::create_directory_symlink(t.outside, t.ec + "/tenant=y");
  const timespec long_ago[2] = {{1000, 0}, {1000, 0}};
  utimensat(AT_FDCWD, t.outside_file.c_str(), long_ago, 0);
  auto p = OpenOrDie({t.ec, 1, std::chrono::seconds(0), nullptr});  // everything over the bound
  EXPECT_EQ(p->Stats().files, 0);
  ASSERT_TRUE(p->Publish({"a", "k"}, Rows(2, 2, 0, 0)).ok());
  ASSERT_TRUE(p->Publish({"b", "k", "x"}, Rows(2, 2, 0, 0)).ok());
  EXPECT_FALSE(fs::exists(p->PathOf("a")));  // evicted: the bound holds no file
  EXPECT_EQ(p->Stats().evicted, 1u);
  EXPECT_EQ(Slurp(t.outside_file), kOutsideBytes);
  EXPECT_TRUE(fs::is_symlink(t.ec + "/victim"));
}

TEST(EcPublisherSafetyTest, FilesAre0640AndDirectories0750WhateverTheUmask) {
  TempDir d;
  const mode_t old = umask(0);
  auto p = OpenOrDie({d.path + "/ec"});
  ASSERT_TRUE(p->Publish({"id", "k"}, Rows(1, 1, 0, 0)).ok());
  ASSERT_TRUE(p->Publish({"id", "k", "alice"}, Rows(1, 1, 0, 0)).ok());
  umask(077);
  ASSERT_TRUE(p->Publish({"other", "k"}, Rows(1, 1, 0, 0)).ok());
  umask(old);
  const auto mode = [](const std::string& path) {
    struct stat st {};
    EXPECT_EQ(lstat(path.c_str(), &st), 0) << path;
    return st.st_mode & 07777;
  };
  EXPECT_EQ(mode(d.path + "/ec"), 0750u);
  EXPECT_EQ(mode(p->PathOf("id")), 0640u);
  EXPECT_EQ(mode(d.path + "/ec/id"), 0750u);
  EXPECT_EQ(mode(p->PathOf("id", "alice")), 0640u);
  EXPECT_EQ(mode(d.path + "/ec/tenant=alice"), 0750u);
  EXPECT_EQ(mode(p->PathOf("other")), 0640u);
  EXPECT_EQ(mode(d.path + "/ec/other"), 0750u);
}

TEST(EcPublisherSafetyTest, TheGroupOptionSetsTheGroupOfFilesAndDirectories) {
  TempDir d;
  const group* nogroup = getgrnam("nogroup");  // NOLINT(concurrency-mt-unsafe): one thread
  if (nogroup == nullptr || (geteuid() != 0 && getegid() != nogroup->gr_gid)) {
    GTEST_SKIP() << "needs group nogroup, and root or membership";
  }
  const gid_t gid = nogroup->gr_gid;
  auto p = OpenOrDie({d.path + "/ec", 0, std::chrono::seconds(30), nullptr, "nogroup"});
  ASSERT_TRUE(p->Publish({"id", "k", "alice"}, Rows(1, 1, 0, 0)).ok());
  for (const std::string& path :
       {p->PathOf("id", "alice"), d.path + "/ec/tenant=alice/id", d.path + "/ec/tenant=alice", d.path + "/ec"}) {
    struct stat st {};
    ASSERT_EQ(lstat(path.c_str(), &st), 0) << path;
    EXPECT_EQ(st.st_gid, gid) << path;
  }
  auto numeric = OpenOrDie({d.path + "/ec2", 0, std::chrono::seconds(30), nullptr, std::to_string(gid)});
  ASSERT_TRUE(numeric->Publish({"id", "k"}, Rows(1, 1, 0, 0)).ok());
  struct stat st {};
  ASSERT_EQ(lstat(numeric->PathOf("id").c_str(), &st), 0);
  EXPECT_EQ(st.st_gid, gid);
  StatusOr<std::unique_ptr<EcPublisher>> unknown =
      EcPublisher::Open({d.path + "/ec3", 0, std::chrono::seconds(30), nullptr, "no-such-group-epd"});
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("--ec-dir-group"), std::string::npos);
}

// B70: a publish whose write fails (here: a file-size limit, which holds
// for root too) left its empty <id>/ directory behind.
TEST(EcPublisherSafetyTest, AFailedPublishLeavesNothingBehind) {
  TempDir d;
  auto p = OpenOrDie({d.path + "/ec"});
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = old;
  small.rlim_cur = 64;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  StatusOr<EcOutcome> shared = p->Publish({"big", "k"}, Rows(16, 16, 0, 0));
  StatusOr<EcOutcome> tenant = p->Publish({"big", "k", "alice"}, Rows(16, 16, 0, 0));
  setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  ASSERT_FALSE(shared.ok());
  EXPECT_NE(shared.status().message().find("File too large"), std::string::npos) << shared.status().message();
  ASSERT_FALSE(tenant.ok());
  EXPECT_EQ(std::distance(fs::directory_iterator(d.path + "/ec"), fs::directory_iterator()), 0);
  EXPECT_EQ(p->Stats().write_failures, 2u);
  EXPECT_EQ(p->Stats().files, 0);
  ASSERT_TRUE(p->Publish({"big", "k"}, Rows(16, 16, 0, 3.0f)).ok());  // and it goes on
  EXPECT_EQ(Read(p->PathOf("big")).rows, MainRows(16, 16, 3.0f));
}

// A tenant's directory that is a symlink is not followed either.
TEST(EcPublisherSafetyTest, ASymlinkAtATenantsDirectoryIsNeverFollowed) {
  Planted t;
  fs::create_directory_symlink(t.outside, t.ec + "/tenant=mallory");
  auto p = OpenOrDie({t.ec});
  EXPECT_FALSE(p->Publish({"id", "k", "mallory"}, Rows(1, 1, 0, 0)).ok());
  EXPECT_EQ(std::distance(fs::directory_iterator(t.outside), fs::directory_iterator()), 1);
  EXPECT_TRUE(fs::is_symlink(t.ec + "/tenant=mallory"));
}

}  // namespace
}  // namespace epd
