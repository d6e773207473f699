// Device IPC on FakeDevice (CPU): the handle's text form, export/import in
// one process, refusals, and the two-process check (ipc_two_process_check).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fake_device.h"

namespace epd {
namespace {

std::vector<std::byte> Rows(std::size_t n, int seed) {
  std::vector<std::byte> v(n);
  const auto offset = static_cast<std::size_t>(seed) * 7;
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 31 + offset) & 0xff);
  return v;
}

// Runs ipc_two_process_check with `args` and returns its wait status (as
// waitpid gives it), or -1 when it cannot be started. posix_spawn, not
// std::system: system() changes the process's signal dispositions while
// it waits (concurrency-mt-unsafe). With `quiet` its stderr is /dev/null.
int RunCheck(std::vector<std::string> args, bool quiet = false) {
  args.insert(args.begin(), EPD_IPC_CHECK_BIN);
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (quiet) posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  int status = -1;
  if (spawned != 0 || waitpid(pid, &status, 0) != pid) return -1;
  return status;
}

TEST(IpcHandleTest, HexRoundTripsAndRejectsMalformedText) {
  IpcHandle h;
  for (std::size_t i = 0; i < IpcHandle::kHandleBytes; ++i) {
    h.memory[i] = static_cast<std::uint8_t>(i);
    h.event[i] = static_cast<std::uint8_t>(255 - i);
  }
  h.bytes = 0x0102030405060708ull;
  const std::string hex = h.Hex();
  ASSERT_EQ(hex.size(), 2u * (64 + 64 + 8));
  EXPECT_EQ(hex.substr(0, 6), "000102");
  EXPECT_EQ(hex.substr(hex.size() - 16), "0102030405060708");
  StatusOr<IpcHandle> back = IpcHandle::FromHex(hex);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->memory, h.memory);
  EXPECT_EQ(back->event, h.event);
  EXPECT_EQ(back->bytes, h.bytes);
  EXPECT_EQ(IpcHandle::FromHex(hex.substr(1)).status().code(), StatusCode::kInvalidArgument);
  std::string upper = hex;
  upper[0] = 'G';
  EXPECT_EQ(IpcHandle::FromHex(upper).status().code(), StatusCode::kInvalidArgument);
}

TEST(FakeDeviceIpcTest, ImportedRowsEqualTheExportedOnesAndOutliveLaterWrites) {
  FakeDevice dev;
  const std::vector<std::byte> want = Rows(100000, 3);
  auto vram = dev.Allocate(want.size());
  ASSERT_TRUE(vram.ok());
  ASSERT_TRUE(dev.CopyAsync(vram->data(), want.data(), want.size(), CopyKind::kHostToDevice, Stream::kOnboard).ok());
  auto exported = dev.ExportIpc(vram->data(), want.size());
  ASSERT_TRUE(exported.ok()) << exported.status().ToString();
  EXPECT_EQ((*exported)->handle().bytes, want.size());
  std::memset(vram->data(), 0, want.size());  // the export holds its own copy
  auto imported = dev.ImportIpc((*exported)->handle());
  ASSERT_TRUE(imported.ok()) << imported.status().ToString();
  ASSERT_TRUE((*imported)->WaitReady().ok());
  ASSERT_EQ((*imported)->size(), want.size());
  EXPECT_EQ(std::memcmp((*imported)->data(), want.data(), want.size()), 0);
}

TEST(FakeDeviceIpcTest, RefusesEmptyExportsForeignHandlesAndEndedExports) {
  FakeDevice dev;
  auto vram = dev.Allocate(64);
  ASSERT_TRUE(vram.ok());
  EXPECT_EQ(dev.ExportIpc(nullptr, 64).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(dev.ExportIpc(vram->data(), 0).status().code(), StatusCode::kInvalidArgument);
  IpcHandle foreign;  // all zero: not a FakeDevice handle (a CUDA one would look like this to us)
  foreign.bytes = 64;
  EXPECT_EQ(dev.ImportIpc(foreign).status().code(), StatusCode::kFailedPrecondition);
  IpcHandle ended;
  {
    auto exported = dev.ExportIpc(vram->data(), 64);
    ASSERT_TRUE(exported.ok());
    ended = (*exported)->handle();
  }  // export destroyed: its memfd is closed
  EXPECT_EQ(dev.ImportIpc(ended).status().code(), StatusCode::kFailedPrecondition);
}

// The exporter and importer in two processes (the binary spawns itself).
TEST(FakeDeviceIpcTest, TwoProcessesShareTheRows) {
  EXPECT_EQ(RunCheck({"--device", "fake", "--bytes", "3000000"}), 0);
}

// The same, exporting from an L1 entry of the GPU tier that is dropped before
// the importer reads (the server's CUDA IPC delivery, docs/SHM.md).
TEST(FakeDeviceIpcTest, TwoProcessesShareRowsExportedFromAnL1Entry) {
  EXPECT_EQ(RunCheck({"--device", "fake", "--bytes", "2097152", "--from-l1"}), 0);
  // Sizes that are not whole rows are refused (exit status 2).
  const int rc = RunCheck({"--device", "fake", "--bytes", "3000", "--from-l1"}, /*quiet=*/true);
  EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 2) << rc;
}

}  // namespace
}  // namespace epd
