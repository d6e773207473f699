// ipc_two_process_check: Device::ExportIpc in one process, ImportIpc in
// another, bytes compared (docs/SHM.md, "CUDA IPC").
//
//   ipc_two_process_check --device fake|cuda [--bytes N] [--from-l1]
//
// The exporter (this invocation) fills N bytes of device memory with a
// pattern through a host-to-device copy, exports them, and starts a second
// process (itself, /proc/self/exe, with --import HANDLE_HEX), which maps the
// rows, waits for the handle's event, copies them device-to-host and compares
// them with the pattern computed on its own. The exporter keeps its export
// alive until the importer exits, as a lease would. Exit status: 0 the bytes
// match; 1 a mismatch or a failure (the line says which); 2 usage. `--device
// cuda` exists only in builds with EPD_IPC_CHECK_WITH_CUDA (src/gpu's
// standalone CUDA build, run by scripts/gpu-check.sh); FakeDevice works
// everywhere (a memfd shared through /proc, fake_device.h).
//
// --from-l1 exports the rows as the server's CUDA IPC delivery does
// (src/server/ipc_delivery.cc): the pattern is the main + deepstack rows of
// an Embedding (float32, hidden 256, 1 deepstack layer; N must be a multiple
// of 2048) uploaded into an L1 entry of the GPU tier (UploadEmbedding), and
// the export copies from the entry's ResidentBytes::data() after Wait(). The
// entry is then dropped before the importer runs, as an L1 eviction may do
// while a client holds its lease.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "epd/gpu/device.h"
#include "epd/gpu/device_tier.h"
#include "fake_device.h"
#ifdef EPD_IPC_CHECK_WITH_CUDA
#include "epd/gpu_cuda/cuda_device.h"
#endif

extern char** environ;

namespace {

// Byte i of the shared rows: a multiplicative hash of i (Knuth's 2654435761),
// so a shifted, truncated or stale copy differs.
std::uint8_t Pattern(std::size_t i) { return static_cast<std::uint8_t>((i * 2654435761u) >> 13); }

epd::StatusOr<std::unique_ptr<epd::Device>> OpenDevice(const std::string& kind) {
  if (kind == "fake") {
    epd::FakeDeviceOptions o;
    o.device_capacity_bytes = std::size_t{256} << 20;
    return std::unique_ptr<epd::Device>(new epd::FakeDevice(o));
  }
#ifdef EPD_IPC_CHECK_WITH_CUDA
  if (kind == "cuda") {
    // The staging copies on both sides come from the pinned pool, which is
    // empty by default (CudaDeviceOptions::pinned_pool_bytes = 0).
    epd::CudaDeviceOptions o;
    o.pinned_pool_bytes = std::size_t{256} << 20;
    return epd::OpenCudaDevice(o);
  }
#endif
  return epd::InvalidArgument("--device " + kind + " is not built into this binary (fake" +
#ifdef EPD_IPC_CHECK_WITH_CUDA
                              std::string(", cuda") +
#else
                              std::string() +
#endif
                              ")");
}

int Fail(const char* who, const epd::Status& s) {
  std::fprintf(stderr, "%s: FAIL: %s\n", who, s.ToString().c_str());
  return 1;
}

int Import(epd::Device& dev, const std::string& hex) {
  epd::StatusOr<epd::IpcHandle> handle = epd::IpcHandle::FromHex(hex);
  if (!handle.ok()) return Fail("importer", handle.status());
  epd::StatusOr<std::unique_ptr<epd::IpcImport>> rows = dev.ImportIpc(*handle);
  if (!rows.ok()) return Fail("importer", rows.status());
  if (epd::Status s = (*rows)->WaitReady(); !s.ok()) return Fail("importer", s);
  const std::size_t n = (*rows)->size();
  epd::StatusOr<epd::DeviceBuffer> host = dev.AllocatePinnedHost(n);
  if (!host.ok()) return Fail("importer", host.status());
  if (epd::Status s =
          dev.CopyAsync(host->data(), (*rows)->data(), n, epd::CopyKind::kDeviceToHost, epd::Stream::kOffload);
      !s.ok()) {
    return Fail("importer", s);
  }
  if (epd::Status s = dev.Synchronize(epd::Stream::kOffload); !s.ok()) return Fail("importer", s);
  const auto* got = reinterpret_cast<const std::uint8_t*>(host->data());
  for (std::size_t i = 0; i < n; ++i) {
    if (got[i] != Pattern(i)) {
      std::fprintf(stderr, "importer: FAIL: byte %zu of %zu is 0x%02x, expected 0x%02x\n", i, n, got[i], Pattern(i));
      return 1;
    }
  }
  std::printf("importer (pid %d): %zu bytes match\n", static_cast<int>(getpid()), n);
  return 0;
}

int Spawn(epd::Device& dev, const std::string& kind, std::size_t n, const epd::IpcExport& shared, const char* from);

// The rows of an L1 entry holding the pattern, exported from the entry.
epd::StatusOr<std::unique_ptr<epd::IpcExport>> ExportFromL1(epd::Device& dev, std::size_t n) {
  auto e = std::make_shared<epd::Embedding>();
  e->hidden = 256;
  e->deepstack_layers = 1;
  e->dtype = epd::DType::kFloat32;
  e->tokens = static_cast<std::int64_t>(n / (std::size_t{2} * 256 * 4));
  e->main.resize(n / 2);
  e->deepstack.resize(n / 2);
  for (std::size_t i = 0; i < n / 2; ++i) {
    e->main[i] = std::byte{Pattern(i)};
    e->deepstack[i] = std::byte{Pattern(n / 2 + i)};
  }
  epd::StatusOr<epd::TierEmbeddingPtr> l1 = epd::UploadEmbedding(dev, e);
  if (!l1.ok()) return l1.status();
  if ((*l1)->where() != epd::MemoryKind::kDevice) return epd::Internal("the L1 entry is not in device memory");
  if (epd::Status s = (*l1)->Wait(); !s.ok()) return s;
  epd::StatusOr<std::unique_ptr<epd::IpcExport>> shared = dev.ExportIpc((*l1)->data(), (*l1)->nbytes());
  l1 = epd::TierEmbeddingPtr();  // evicted: the export keeps its own copy
  dev.Poll();
  return shared;
}

int Export(epd::Device& dev, const std::string& kind, std::size_t n, bool from_l1) {
  if (from_l1) {
    epd::StatusOr<std::unique_ptr<epd::IpcExport>> shared = ExportFromL1(dev, n);
    if (!shared.ok()) return Fail("exporter", shared.status());
    return Spawn(dev, kind, n, **shared, "from an L1 entry");
  }
  epd::StatusOr<epd::DeviceBuffer> host = dev.AllocatePinnedHost(n);
  epd::StatusOr<epd::DeviceBuffer> vram = dev.Allocate(n);
  if (!host.ok()) return Fail("exporter", host.status());
  if (!vram.ok()) return Fail("exporter", vram.status());
  auto* h = reinterpret_cast<std::uint8_t*>(host->data());
  for (std::size_t i = 0; i < n; ++i) h[i] = Pattern(i);
  if (epd::Status s = dev.CopyAsync(vram->data(), host->data(), n, epd::CopyKind::kHostToDevice, epd::Stream::kOnboard);
      !s.ok()) {
    return Fail("exporter", s);
  }
  if (epd::Status s = dev.Synchronize(epd::Stream::kOnboard); !s.ok()) return Fail("exporter", s);
  epd::StatusOr<std::unique_ptr<epd::IpcExport>> shared = dev.ExportIpc(vram->data(), n);
  if (!shared.ok()) return Fail("exporter", shared.status());
  // The export holds its own copy: overwrite the source to show the importer
  // does not read it.
  std::memset(h, 0, n);
  if (epd::Status s = dev.CopyAsync(vram->data(), host->data(), n, epd::CopyKind::kHostToDevice, epd::Stream::kOnboard);
      !s.ok()) {
    return Fail("exporter", s);
  }
  return Spawn(dev, kind, n, **shared, "from a device buffer");
}

// Runs the importer on `shared`'s handle while it lives; 0 when it matched.
int Spawn(epd::Device& dev, const std::string& kind, std::size_t n, const epd::IpcExport& shared, const char* from) {
  const std::string hex = shared.handle().Hex();
  std::vector<std::string> args = {"/proc/self/exe", "--device", kind, "--import", hex};
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  char exe[4096] = {};
  if (readlink("/proc/self/exe", exe, sizeof(exe) - 1) <= 0) return Fail("exporter", epd::Internal("readlink"));
  pid_t child = 0;
  if (int rc = posix_spawn(&child, exe, nullptr, nullptr, argv.data(), environ); rc != 0) {
    return Fail("exporter", epd::Internal(std::string("posix_spawn: ") + std::generic_category().message(rc)));
  }
  int status = 0;
  if (waitpid(child, &status, 0) != child) return Fail("exporter", epd::Internal("waitpid"));
  const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  std::printf("exporter (pid %d, %s): %zu bytes exported %s; importer %s\n", static_cast<int>(getpid()),
              dev.Describe().c_str(), n, from, ok ? "matched them" : "FAILED");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string kind = "fake", import_hex;
  bool from_l1 = false;
  std::size_t bytes = std::size_t{2} << 20;  // a 512x512 float32 embedding's main rows
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--device" && i + 1 < argc) {
      kind = argv[++i];
    } else if (a == "--import" && i + 1 < argc) {
      import_hex = argv[++i];
    } else if (a == "--from-l1") {
      from_l1 = true;
    } else if (a == "--bytes" && i + 1 < argc) {
      bytes = std::strtoull(argv[++i], nullptr, 10);
    } else {
      std::fprintf(stderr, "usage: %s --device fake|cuda [--bytes N] [--from-l1]\n", argv[0]);
      return 2;
    }
  }
  if (bytes == 0) {
    std::fprintf(stderr, "--bytes must be > 0\n");
    return 2;
  }
  if (from_l1 && bytes % 2048 != 0) {
    std::fprintf(stderr, "--from-l1: --bytes must be a multiple of 2048 (main + deepstack rows of 256 floats)\n");
    return 2;
  }
  epd::StatusOr<std::unique_ptr<epd::Device>> dev = OpenDevice(kind);
  if (!dev.ok()) return Fail(import_hex.empty() ? "exporter" : "importer", dev.status());
  return import_hex.empty() ? Export(**dev, kind, bytes, from_l1) : Import(**dev, import_hex);
}
