// ipc_fetch_check: a second process that fetches an image's embedding from a
// running encode server twice, inline and by CUDA IPC (docs/SHM.md, "CUDA
// IPC"), and compares the bytes.
//
//   ipc_fetch_check --server TARGET --image PATH --device fake|cuda[:N]
//
// 1. Encodes PATH with inline delivery (a miss the first time; it warms L1).
// 2. Encodes it again with Delivery::kCudaIpc (an L1 hit of the server's GPU
//    tier), imports the rows on --device, waits for them, copies them to the
//    host (Device::CopyAsync, device to host) and compares them with step 1's
//    main + deepstack bytes.
// 3. Releases the lease (a Release call) and prints one line:
//      ipc_bytes=N fnv1a64=HEX source=l1|l2|miss|... same_as_inline=yes|no
//    FNV-1a 64 (Fowler, Noll, Vo; offset basis 0xcbf29ce484222325, prime
//    0x100000001b3) over the IPC rows, so a caller can compare with bytes it
//    computed itself.
// Exit status: 0 when the rows came by CUDA IPC and equal the inline bytes;
// 1 when they differ; 2 for a usage error or when any step fails (the
// message names the step), including an item that did not come by CUDA IPC.
// `--device fake` imports a FakeDevice export (a server whose GPU tier runs
// on FakeDevice, e.g. ipc_server_test); `--device cuda` exists only in
// builds with EPD_IPC_FETCH_WITH_CUDA (the cuda_ipc_fetch_check target).
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "epd/client/client.h"
#include "fake_device.h"
#ifdef EPD_IPC_FETCH_WITH_CUDA
#include "epd/gpu_cuda/cuda_device.h"
#endif

namespace {

int Fail(const std::string& what) {
  std::fprintf(stderr, "ipc_fetch_check: %s\n", what.c_str());
  return 2;
}

std::uint64_t Fnv1a64(const std::vector<std::byte>& bytes) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (std::byte b : bytes) {
    h ^= static_cast<std::uint8_t>(b);
    h *= 0x100000001b3ULL;
  }
  return h;
}

epd::StatusOr<std::unique_ptr<epd::Device>> OpenDevice(const std::string& kind) {
  if (kind == "fake") return std::unique_ptr<epd::Device>(new epd::FakeDevice());
#ifdef EPD_IPC_FETCH_WITH_CUDA
  if (kind == "cuda" || kind.rfind("cuda:", 0) == 0) {
    epd::CudaDeviceOptions o;
    o.device_index = kind == "cuda" ? 0 : std::atoi(kind.c_str() + 5);
    return epd::OpenCudaDevice(o);
  }
  return epd::InvalidArgument("--device must be fake, cuda or cuda:N, got '" + kind + "'");
#else
  return epd::InvalidArgument("--device must be fake in this build (cuda_ipc_fetch_check has cuda), got '" + kind +
                              "'");
#endif
}

// Step 1: the item's main + deepstack bytes by inline delivery. An error's
// message names the step, as Fail prints it.
epd::Status FetchInline(const std::string& target, const std::string& image, std::vector<std::byte>* rows) {
  auto client = epd::EncodeClient::Connect({.target = target});
  if (!client.ok()) return epd::Internal("inline client: " + client.status().ToString());
  epd::EncodeResult r = (*client)->Encode({epd::ClientItem{image}});
  if (!r.status.ok()) return epd::Internal("inline Encode: " + r.status.ToString());
  const epd::Embedding& e = *r.items[0].embedding;
  rows->assign(e.main.begin(), e.main.end());
  rows->insert(rows->end(), e.deepstack.begin(), e.deepstack.end());
  return epd::Status::Ok();
}

// Step 2: the rows imported on `device`, once they landed, copied to the
// host, and the lease released; where they came from in *source. The
// client and its leases go before the device.
epd::Status FetchByIpc(const std::string& target, const std::string& image, epd::Device& device,
                       std::vector<std::byte>* rows, std::string* source) {
  epd::ClientOptions o{.target = target};
  o.delivery = epd::Delivery::kCudaIpc;
  o.ipc_device = &device;
  o.ipc_fallback_shm = false;
  auto client = epd::EncodeClient::Connect(o);
  if (!client.ok()) return epd::Internal("CUDA IPC client: " + client.status().ToString());
  epd::EncodeResult r = (*client)->Encode({epd::ClientItem{image}});
  if (!r.status.ok()) return epd::Internal("CUDA IPC Encode: " + r.status.ToString());
  const epd::ClientItemResult& item = r.items[0];
  if (item.ipc == nullptr) {
    return epd::Internal(std::string("the item came ") + (item.shm != nullptr ? "by shared memory" : "inline") +
                         ", not by CUDA IPC (is the server's GPU tier on, with --ipc-export-mb?)");
  }
  *source = std::string(epd::ItemSourceName(item.source));
  if (epd::Status s = item.ipc->WaitReady(); !s.ok()) return epd::Internal("WaitReady: " + s.ToString());
  rows->resize(item.ipc->nbytes());
  if (epd::Status s = device.CopyAsync(rows->data(), item.ipc->data(), rows->size(), epd::CopyKind::kDeviceToHost,
                                       epd::Stream::kOffload);
      !s.ok()) {
    return epd::Internal("copying the imported rows to the host: " + s.ToString());
  }
  if (epd::Status s = device.Synchronize(epd::Stream::kOffload); !s.ok()) {
    return epd::Internal("waiting for the copy: " + s.ToString());
  }
  if (epd::Status s = item.ipc->Release(); !s.ok()) return epd::Internal("releasing the lease: " + s.ToString());
  return epd::Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  std::string target, image_path, device_kind = "fake";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--server" && i + 1 < argc) {
      target = argv[++i];
    } else if (a == "--image" && i + 1 < argc) {
      image_path = argv[++i];
    } else if (a == "--device" && i + 1 < argc) {
      device_kind = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s --server TARGET --image PATH --device fake|cuda[:N]\n", argv[0]);
      return 2;
    }
  }
  if (target.empty() || image_path.empty()) return Fail("--server and --image are required");
  std::ifstream in(image_path, std::ios::binary);
  if (!in) return Fail("cannot read " + image_path);
  const std::string image((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());

  epd::StatusOr<std::unique_ptr<epd::Device>> device = OpenDevice(device_kind);
  if (!device.ok()) return Fail("opening the device: " + device.status().ToString());
  std::vector<std::byte> inline_rows, ipc_rows;
  std::string source;
  if (epd::Status s = FetchInline(target, image, &inline_rows); !s.ok()) return Fail(s.message());
  if (epd::Status s = FetchByIpc(target, image, **device, &ipc_rows, &source); !s.ok()) return Fail(s.message());

  const bool same = ipc_rows == inline_rows;
  std::printf("ipc_bytes=%zu fnv1a64=%016llx source=%s same_as_inline=%s\n", ipc_rows.size(),
              static_cast<unsigned long long>(Fnv1a64(ipc_rows)), source.c_str(), same ? "yes" : "no");
  if (!same) {
    std::fprintf(stderr, "ipc_fetch_check: the CUDA IPC rows (%zu bytes) differ from the inline bytes (%zu)\n",
                 ipc_rows.size(), inline_rows.size());
  }
  return same ? 0 : 1;
}
