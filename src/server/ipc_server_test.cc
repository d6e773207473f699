// CUDA IPC delivery end to end on CPU (docs/SHM.md, "CUDA IPC"): a real
// in-process EncodeServer whose GPU tier runs on FakeDevice (L1 in its fake
// VRAM, the tower's output adopted device to device), the raw stub, the
// client library, and a second process (ipc_fetch_check) that imports the
// rows. Expected rows come from FakeTower::Reference over an independent
// decode (worker_test_util.h) and from the same server's inline replies.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "client_convert.h"
#include "epd/client/client.h"
#include "epd/gpu/device_tier.h"
#include "fake_device.h"
#include "ipc_leases.h"
#include "test_server.h"
#include "worker_test_util.h"

namespace epd::testing {
namespace {

using std::chrono::milliseconds;

std::string AsString(const std::vector<std::byte>& b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}
std::string Rows(const Embedding& e) { return AsString(e.main) + AsString(e.deepstack); }

// A server whose GPU tier lives on `dev` (gpu_tier) or in host memory, with
// CUDA IPC delivery through `dev`. Members are destroyed in reverse order:
// the server before the hooks and the device, as epd/gpu/device.h requires.
struct IpcServer {
  std::unique_ptr<FakeDevice> dev = std::make_unique<FakeDevice>();
  EmbeddingTierHooks hooks;
  TestServer t;
};

struct IpcServerOptions {
  std::int64_t ipc_bytes = 8 << 20;
  std::int64_t shm_bytes = 0;
  milliseconds lease{60000};
  bool gpu_tier = true;
};

std::unique_ptr<IpcServer> StartIpcServer(IpcServerOptions io = {}) {
  auto s = std::make_unique<IpcServer>();
  TestServerOptions o;
  o.server.ipc_device = s->dev.get();
  o.server.ipc_export_bytes = io.ipc_bytes;
  o.server.ipc_lease = io.lease;
  o.server.shm_arena_bytes = io.shm_bytes;
  if (io.gpu_tier) {
    s->hooks = MakeEmbeddingTierHooks(*s->dev);
    o.worker.to_host = s->hooks.to_host;
    o.worker.to_device = s->hooks.to_device;
    o.worker.adopt_device_rows = s->hooks.adopt_device_rows;
    o.tower.output_on_device = true;
  }
  s->t = StartTestServer(o);
  return s;
}

v1::EncodeRequest IpcRequest(const std::string& id, const std::vector<std::string>& images, bool fallback_shm = false) {
  v1::EncodeRequest req = MakeRequest(id, images);
  req.set_delivery(v1::DELIVERY_CUDA_IPC);
  req.set_ipc_fallback_shm(fallback_shm);
  return req;
}

IpcHandle HandleOf(const v1::CudaIpcRef& ref) {
  IpcHandle h;
  EXPECT_EQ(ref.memory_handle().size(), IpcHandle::kHandleBytes);
  EXPECT_EQ(ref.event_handle().size(), IpcHandle::kHandleBytes);
  std::memcpy(h.memory.data(), ref.memory_handle().data(), std::min(ref.memory_handle().size(), h.memory.size()));
  std::memcpy(h.event.data(), ref.event_handle().data(), std::min(ref.event_handle().size(), h.event.size()));
  h.bytes = ref.length();
  return h;
}

// The rows a CUDA IPC reply points at, imported by a FakeDevice of this
// process (through /proc, as another process would).
std::string ImportedRows(const v1::CudaIpcRef& ref) {
  FakeDevice importer;
  StatusOr<std::unique_ptr<IpcImport>> imp = importer.ImportIpc(HandleOf(ref));
  EXPECT_TRUE(imp.ok()) << imp.status().ToString();
  if (!imp.ok()) return "";
  EXPECT_TRUE((*imp)->WaitReady().ok());
  return std::string(reinterpret_cast<const char*>((*imp)->data()), (*imp)->size());
}

grpc::Status ReleaseIpc(v1::Encoder::Stub& stub, std::uint64_t generation, v1::ReleaseResponse* resp) {
  v1::ReleaseRequest req;
  v1::ShmLease* l = req.add_leases();
  l->set_generation(generation);
  l->set_kind(v1::LEASE_KIND_CUDA_IPC);
  grpc::ClientContext ctx;
  return stub.Release(&ctx, req, resp);
}

// FNV-1a 64 (Fowler, Noll, Vo), as ipc_fetch_check prints it.
std::uint64_t Fnv1a64(const std::string& bytes) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

TEST(IpcDeliveryTest, AnL1HitComesByCudaIpcWithTheInlineBytesAndRepeatsShareOneExport) {
  auto s = StartIpcServer();
  const std::string img = Png(84, 56, 3);
  const Embedding want = Expected(img);
  RawCall inline_call = CallEncode(*s->t.stub, MakeRequest("in", {img}));
  ASSERT_TRUE(inline_call.status.ok()) << inline_call.status.error_message();
  EXPECT_EQ(inline_call.items[0].source(), v1::SOURCE_MISS);
  RawCall ipc_call = CallEncode(*s->t.stub, IpcRequest("ipc", {img}));
  ASSERT_TRUE(ipc_call.status.ok()) << ipc_call.status.error_message();
  ASSERT_EQ(ipc_call.items.size(), 1u);
  const v1::EncodedItem& item = ipc_call.items[0];
  ASSERT_TRUE(item.has_cuda_ipc());
  EXPECT_FALSE(item.has_shm());
  EXPECT_TRUE(item.main().empty());
  EXPECT_TRUE(item.deepstack().empty());
  EXPECT_EQ(item.source(), v1::SOURCE_L1);
  EXPECT_EQ(item.tokens(), want.tokens);
  EXPECT_EQ(item.hidden(), want.hidden);
  EXPECT_EQ(item.deepstack_layers(), want.deepstack_layers);
  ASSERT_EQ(item.grid_thw_size(), 3);
  EXPECT_EQ(item.grid_thw(1), want.grid.h);
  const v1::CudaIpcRef& ref = item.cuda_ipc();
  EXPECT_EQ(ref.length(), want.main.size() + want.deepstack.size());
  EXPECT_EQ(ref.deepstack_offset(), want.main.size());
  EXPECT_EQ(ref.device().rfind("fake", 0), 0u) << ref.device();
  EXPECT_EQ(ref.device_index(), -1);
  EXPECT_EQ(ref.pid(), getpid());
  EXPECT_EQ(ref.lease_ms(), 60000);
  EXPECT_EQ(ref.event_handle(), std::string(64, '\0'));  // FakeDevice: ready at export
  const std::string rows = ImportedRows(ref);
  EXPECT_EQ(rows, Rows(want));
  EXPECT_EQ(rows, inline_call.items[0].main() + inline_call.items[0].deepstack());

  // A second hit leases the same export under a new generation.
  RawCall again = CallEncode(*s->t.stub, IpcRequest("ipc2", {img}));
  ASSERT_TRUE(again.status.ok());
  ASSERT_TRUE(again.items[0].has_cuda_ipc());
  EXPECT_EQ(again.items[0].cuda_ipc().memory_handle(), ref.memory_handle());
  EXPECT_NE(again.items[0].cuda_ipc().generation(), ref.generation());
  const IpcStats st = s->t.server->Stats().ipc;
  EXPECT_EQ(st.items, 2u);
  EXPECT_EQ(st.reused, 1u);
  EXPECT_EQ(st.exports, 1);
  EXPECT_EQ(st.leases, 2);
  EXPECT_EQ(st.exported_bytes, static_cast<std::int64_t>(ref.length()));
  EXPECT_EQ(st.capacity_bytes, 8 << 20);
  EXPECT_EQ(st.fallbacks + st.not_resident, 0u);
}

TEST(IpcDeliveryTest, AFreshDeviceResidentTowerOutputComesByCudaIpcToo) {
  auto s = StartIpcServer();
  const std::string img = Png(56, 56, 4);
  RawCall call = CallEncode(*s->t.stub, IpcRequest("miss", {img}));
  ASSERT_TRUE(call.status.ok()) << call.status.error_message();
  EXPECT_EQ(call.items[0].source(), v1::SOURCE_MISS);
  ASSERT_TRUE(call.items[0].has_cuda_ipc());
  EXPECT_EQ(ImportedRows(call.items[0].cuda_ipc()), Rows(Expected(img)));
}

TEST(IpcDeliveryTest, ASecondProcessImportsTheSameBytesAsInline) {
  auto s = StartIpcServer();
  const std::string img = Png(112, 84, 5);
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("epd_ipc_" + std::to_string(getpid()) + ".png");
  {
    std::ofstream f(path, std::ios::binary);
    f << img;
  }
  const std::string cmd =
      std::string(EPD_IPC_FETCH_BIN) + " --server " + s->t.target + " --device fake --image " + path.string();
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof(buf), p) != nullptr) out += buf;
  const int rc = pclose(p);
  std::filesystem::remove(path);
  EXPECT_EQ(rc, 0) << out;
  const std::string want = Rows(Expected(img));
  char line[256];
  std::snprintf(line, sizeof(line), "ipc_bytes=%zu fnv1a64=%016llx source=l1 same_as_inline=yes\n", want.size(),
                static_cast<unsigned long long>(Fnv1a64(want)));
  EXPECT_EQ(out, line);
  // The tool released its lease; the export is gone with it.
  const IpcStats st = s->t.server->Stats().ipc;
  EXPECT_EQ(st.items, 1u);
  EXPECT_EQ(st.released, 1u);
  EXPECT_EQ(st.leases, 0);
  EXPECT_EQ(st.exports, 0);
  EXPECT_EQ(st.exported_bytes, 0);
}

TEST(IpcDeliveryTest, ReleaseRefusesWrongGenerationsAndRepeatsAndEndsTheExport) {
  auto s = StartIpcServer({.shm_bytes = 1 << 20});
  RawCall call = CallEncode(*s->t.stub, IpcRequest("r", {Png(56, 56, 1)}));
  ASSERT_TRUE(call.status.ok());
  ASSERT_TRUE(call.items[0].has_cuda_ipc());
  const v1::CudaIpcRef ref = call.items[0].cuda_ipc();
  v1::ReleaseResponse resp;
  grpc::Status wrong = ReleaseIpc(*s->t.stub, ref.generation() + 7, &resp);
  EXPECT_EQ(wrong.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(wrong.error_message().find("CUDA IPC lease"), std::string::npos) << wrong.error_message();
  EXPECT_EQ(s->t.server->Stats().ipc.leases, 1);
  // The same generation as a shared-memory lease is another lease: refused there.
  {
    v1::ReleaseRequest req;
    req.add_leases()->set_generation(ref.generation());
    grpc::ClientContext ctx;
    EXPECT_EQ(s->t.stub->Release(&ctx, req, &resp).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_EQ(s->t.server->Stats().shm.refused_releases, 1u);
  }
  ASSERT_TRUE(ReleaseIpc(*s->t.stub, ref.generation(), &resp).ok());
  EXPECT_EQ(resp.released(), 1u);
  EXPECT_EQ(ReleaseIpc(*s->t.stub, ref.generation(), &resp).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  const IpcStats st = s->t.server->Stats().ipc;
  EXPECT_EQ(st.leases, 0);
  EXPECT_EQ(st.exports, 0);
  EXPECT_EQ(st.released, 1u);
  EXPECT_EQ(st.refused_releases, 2u);
  // The export is gone: its handle no longer imports, and says why.
  FakeDevice importer;
  StatusOr<std::unique_ptr<IpcImport>> imp = importer.ImportIpc(HandleOf(ref));
  ASSERT_FALSE(imp.ok());
  EXPECT_EQ(imp.status().code(), StatusCode::kFailedPrecondition);
  // (Its descriptor is closed, or reused by another file: either is named.)
  const std::string why = imp.status().message();  // status() is a copy
  EXPECT_TRUE(why.find("export has ended") != std::string::npos || why.find("exporter has exited") != std::string::npos)
      << why;
}

TEST(IpcDeliveryTest, ReleasesRideOnEncodeAndNeverFailIt) {
  auto s = StartIpcServer();
  RawCall first = CallEncode(*s->t.stub, IpcRequest("a", {Png(56, 56, 1)}));
  ASSERT_TRUE(first.items[0].has_cuda_ipc());
  v1::EncodeRequest next = IpcRequest("b", {Png(56, 56, 2)});
  v1::ShmLease* good = next.add_release();
  good->set_generation(first.items[0].cuda_ipc().generation());
  good->set_kind(v1::LEASE_KIND_CUDA_IPC);
  v1::ShmLease* bad = next.add_release();
  bad->set_generation(999);
  bad->set_kind(v1::LEASE_KIND_CUDA_IPC);
  RawCall second = CallEncode(*s->t.stub, next);
  ASSERT_TRUE(second.status.ok()) << second.status.error_message();
  const IpcStats st = s->t.server->Stats().ipc;
  EXPECT_EQ(st.released, 1u);
  EXPECT_EQ(st.refused_releases, 1u);
  EXPECT_EQ(st.leases, 1);
}

TEST(IpcDeliveryTest, AnUnreleasedLeaseExpiresAndItsExportIsFreed) {
  auto s = StartIpcServer({.lease = milliseconds(50)});
  RawCall call = CallEncode(*s->t.stub, IpcRequest("r", {Png(56, 56, 1)}));
  ASSERT_TRUE(call.status.ok());
  ASSERT_TRUE(call.items[0].has_cuda_ipc());
  EXPECT_EQ(call.items[0].cuda_ipc().lease_ms(), 50);
  ASSERT_TRUE(WaitFor([&] {
    const IpcStats st = s->t.server->Stats().ipc;
    return st.leases == 0 && st.exports == 0 && st.exported_bytes == 0 && st.expired == 1;
  }));
  v1::ReleaseResponse resp;
  EXPECT_EQ(ReleaseIpc(*s->t.stub, call.items[0].cuda_ipc().generation(), &resp).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

TEST(IpcDeliveryTest, PastTheExportBoundItemsFallBackToShmWhenAllowedElseInlineAndAreCounted) {
  const std::string a = Png(56, 56, 1), b = Png(56, 56, 2), c = Png(56, 56, 3);
  const std::size_t item_bytes = Expected(a).nbytes();
  // Room for one export only.
  auto s = StartIpcServer({.ipc_bytes = static_cast<std::int64_t>(item_bytes + item_bytes / 2), .shm_bytes = 1 << 20});
  RawCall first = CallEncode(*s->t.stub, IpcRequest("a", {a}));
  ASSERT_TRUE(first.items[0].has_cuda_ipc());
  RawCall to_shm = CallEncode(*s->t.stub, IpcRequest("b", {b}, /*fallback_shm=*/true));
  ASSERT_TRUE(to_shm.status.ok());
  EXPECT_FALSE(to_shm.items[0].has_cuda_ipc());
  EXPECT_TRUE(to_shm.items[0].has_shm());
  RawCall to_inline = CallEncode(*s->t.stub, IpcRequest("c", {c}, /*fallback_shm=*/false));
  ASSERT_TRUE(to_inline.status.ok());
  EXPECT_FALSE(to_inline.items[0].has_cuda_ipc());
  EXPECT_FALSE(to_inline.items[0].has_shm());
  EXPECT_EQ(to_inline.items[0].main() + to_inline.items[0].deepstack(), Rows(Expected(c)));
  // The key already exported still shares its export (no new bytes).
  RawCall repeat = CallEncode(*s->t.stub, IpcRequest("a2", {a}));
  EXPECT_TRUE(repeat.items[0].has_cuda_ipc());
  const ServerStats st = s->t.server->Stats();
  EXPECT_EQ(st.ipc.fallbacks, 2u);
  EXPECT_EQ(st.ipc.not_resident, 0u);
  EXPECT_EQ(st.ipc.items, 2u);
  EXPECT_EQ(st.ipc.exports, 1);
  EXPECT_EQ(st.ipc.exported_bytes, static_cast<std::int64_t>(item_bytes));
  EXPECT_EQ(st.shm.items, 1u);
}

TEST(IpcDeliveryTest, RowsOutsideDeviceMemoryFallBackAndAreCountedAsNotResident) {
  // The CPU tier: every row is in host memory.
  auto s = StartIpcServer({.shm_bytes = 1 << 20, .gpu_tier = false});
  const std::string img = Png(56, 56, 6);
  RawCall call = CallEncode(*s->t.stub, IpcRequest("cpu", {img}));
  ASSERT_TRUE(call.status.ok());
  EXPECT_FALSE(call.items[0].has_cuda_ipc());
  EXPECT_EQ(call.items[0].main() + call.items[0].deepstack(), Rows(Expected(img)));
  RawCall shm = CallEncode(*s->t.stub, IpcRequest("cpu2", {img}, /*fallback_shm=*/true));
  EXPECT_EQ(shm.items[0].source(), v1::SOURCE_L1);
  EXPECT_TRUE(shm.items[0].has_shm());
  const IpcStats st = s->t.server->Stats().ipc;
  EXPECT_EQ(st.not_resident, 2u);
  EXPECT_EQ(st.fallbacks, 0u);
  EXPECT_EQ(st.items, 0u);
  EXPECT_EQ(st.exports, 0);
}

TEST(IpcDeliveryTest, WithoutCudaIpcTheServerSendsInlineAndRefusesIpcReleases) {
  TestServer t = StartTestServer();
  const std::string img = Png(56, 56, 7);
  RawCall call = CallEncode(*t.stub, IpcRequest("x", {img}));
  ASSERT_TRUE(call.status.ok());
  EXPECT_FALSE(call.items[0].has_cuda_ipc());
  EXPECT_EQ(call.items[0].main() + call.items[0].deepstack(), Rows(Expected(img)));
  v1::ReleaseResponse resp;
  grpc::Status s = ReleaseIpc(*t.stub, 1, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("no CUDA IPC"), std::string::npos) << s.error_message();
}

// --- Lease sessions (docs/SHM.md, "Crashed clients") ---------------------------

// An open Session call on the raw stub; the first event names it.
struct RawSession {
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SessionMessage, v1::SessionEvent>> stream;
  v1::SessionEvent first;
  bool named = false;

  explicit RawSession(v1::Encoder::Stub& stub) {
    stream = stub.Session(&ctx);
    named = stream->Read(&first);
  }
  // Half-closes the stream, as a client that ends its session does, and
  // returns the call's status. The server releases the session's leases
  // before it finishes the call.
  grpc::Status End() {
    stream->WritesDone();
    v1::SessionEvent e;
    while (stream->Read(&e)) {
    }
    return stream->Finish();
  }
};

// True when `ref`'s export still imports and holds `rows`.
bool ExportHolds(const v1::CudaIpcRef& ref, const std::string& rows) {
  FakeDevice importer;
  StatusOr<std::unique_ptr<IpcImport>> imp = importer.ImportIpc(HandleOf(ref));
  if (!imp.ok() || !(*imp)->WaitReady().ok()) return false;
  return std::string(reinterpret_cast<const char*>((*imp)->data()), (*imp)->size()) == rows;
}

TEST(IpcSessionTest, EndingASessionReleasesItsCudaIpcLeasesAndFreesExportsWithNoOtherLease) {
  // No arena: CUDA IPC alone gives the server lease sessions. A lease time no
  // test waits out, so only the session can end these leases.
  auto s = StartIpcServer({.lease = milliseconds(600000)});
  RawSession session(*s->t.stub);
  ASSERT_TRUE(session.named);
  EXPECT_EQ(session.first.session_id().size(), 32u);
  EXPECT_EQ(session.first.lease_ms(), 600000);  // the CUDA IPC lease, there being no arena
  const std::string& id = session.first.session_id();
  const std::string a = Png(56, 56, 1), b = Png(84, 56, 2);

  RawCall in_a = CallEncodeIn(*s->t.stub, IpcRequest("a", {a}), id);
  RawCall out_b = CallEncodeIn(*s->t.stub, IpcRequest("b", {b}), "");
  RawCall in_b = CallEncodeIn(*s->t.stub, IpcRequest("b2", {b}), id);  // shares b's export
  for (const RawCall* c : {&in_a, &out_b, &in_b}) {
    ASSERT_TRUE(c->status.ok()) << c->status.error_message();
    ASSERT_EQ(c->items.size(), 1u);
    ASSERT_TRUE(c->items[0].has_cuda_ipc());
  }
  EXPECT_TRUE(in_a.items[0].cuda_ipc().in_session());
  EXPECT_FALSE(out_b.items[0].cuda_ipc().in_session());
  EXPECT_TRUE(in_b.items[0].cuda_ipc().in_session());
  EXPECT_EQ(in_b.items[0].cuda_ipc().memory_handle(), out_b.items[0].cuda_ipc().memory_handle());
  IpcStats st = s->t.server->Stats().ipc;
  EXPECT_EQ(st.leases, 3);
  EXPECT_EQ(st.exports, 2);
  EXPECT_EQ(s->t.server->Stats().shm.sessions, 1);

  EXPECT_TRUE(session.End().ok());
  st = s->t.server->Stats().ipc;
  EXPECT_EQ(st.leases, 1);  // the lease made outside the session
  EXPECT_EQ(st.session_reclaimed, 2u);
  EXPECT_EQ(st.released, 0u);
  EXPECT_EQ(st.expired, 0u);
  // a's export had only the session's lease: freed. b's is held by the other lease.
  EXPECT_EQ(st.exports, 1);
  EXPECT_EQ(st.exported_bytes, static_cast<std::int64_t>(Expected(b).nbytes()));
  EXPECT_FALSE(ExportHolds(in_a.items[0].cuda_ipc(), Rows(Expected(a))));
  EXPECT_TRUE(ExportHolds(out_b.items[0].cuda_ipc(), Rows(Expected(b))));
  // The session's leases are gone: releasing one now is refused.
  v1::ReleaseResponse resp;
  EXPECT_EQ(ReleaseIpc(*s->t.stub, in_a.items[0].cuda_ipc().generation(), &resp).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  ASSERT_TRUE(ReleaseIpc(*s->t.stub, out_b.items[0].cuda_ipc().generation(), &resp).ok());
  st = s->t.server->Stats().ipc;
  EXPECT_EQ(st.leases, 0);
  EXPECT_EQ(st.exports, 0);
  EXPECT_EQ(st.exported_bytes, 0);
  EXPECT_EQ(st.released, 1u);
  EXPECT_EQ(st.refused_releases, 1u);
  EXPECT_EQ(st.expired, 0u);
  // The Stats RPC carries the counter.
  v1::StatsResponse remote;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(s->t.stub->Stats(&ctx, v1::StatsRequest(), &remote).ok());
  }
  EXPECT_EQ(remote.ipc_session_reclaimed(), 2u);
}

TEST(IpcSessionTest, OneSessionEndReleasesBothKindsOfLease) {
  const std::string a = Png(56, 56, 3), b = Png(56, 56, 4);
  const std::size_t item_bytes = Expected(a).nbytes();
  // Room for one export: b falls back to shared memory, in the same session.
  auto s = StartIpcServer({.ipc_bytes = static_cast<std::int64_t>(item_bytes + item_bytes / 2),
                           .shm_bytes = 1 << 20,
                           .lease = milliseconds(600000)});
  RawSession session(*s->t.stub);
  ASSERT_TRUE(session.named);
  RawCall call = CallEncodeIn(*s->t.stub, IpcRequest("ab", {a, b}, /*fallback_shm=*/true), session.first.session_id());
  ASSERT_TRUE(call.status.ok()) << call.status.error_message();
  ASSERT_EQ(call.items.size(), 2u);
  int by_ipc = 0, by_shm = 0;
  for (const v1::EncodedItem& item : call.items) {
    if (item.has_cuda_ipc()) {
      ++by_ipc;
      EXPECT_TRUE(item.cuda_ipc().in_session());
    } else {
      ASSERT_TRUE(item.has_shm());
      ++by_shm;
      EXPECT_TRUE(item.shm().in_session());
    }
  }
  EXPECT_EQ(by_ipc, 1);
  EXPECT_EQ(by_shm, 1);
  EXPECT_TRUE(session.End().ok());
  const ServerStats st = s->t.server->Stats();
  EXPECT_EQ(st.ipc.leases, 0);
  EXPECT_EQ(st.ipc.exports, 0);
  EXPECT_EQ(st.ipc.session_reclaimed, 1u);
  EXPECT_EQ(st.ipc.expired, 0u);
  EXPECT_EQ(st.shm.leases, 0);
  EXPECT_EQ(st.shm.session_reclaimed, 1u);
  EXPECT_EQ(st.shm.expired, 0u);
}

TEST(IpcSessionTest, AnUnknownSessionLeavesCudaIpcLeasesOutsideAnySessionAndAMalformedOneIsRefused) {
  auto s = StartIpcServer();
  RawCall call = CallEncodeIn(*s->t.stub, IpcRequest("u", {Png(56, 56, 5)}), std::string(32, 'a'));
  ASSERT_TRUE(call.status.ok()) << call.status.error_message();
  ASSERT_TRUE(call.items[0].has_cuda_ipc());
  EXPECT_FALSE(call.items[0].cuda_ipc().in_session());
  EXPECT_EQ(s->t.server->Stats().shm.session_unknown, 1u);
  RawCall bad = CallEncodeIn(*s->t.stub, IpcRequest("m", {Png(56, 56, 5)}), "xyz");
  EXPECT_EQ(bad.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(bad.items.empty());
  EXPECT_EQ(s->t.server->Stats().ipc.leases, 1);
}

TEST(IpcSessionTest, TheClientLibraryHoldsItsCudaIpcLeasesInASession) {
  auto s = StartIpcServer({.lease = milliseconds(600000)});
  FakeDevice importer;  // outlives the client and its leases
  ClientOptions co{.target = s->t.target};
  co.delivery = Delivery::kCudaIpc;
  co.ipc_device = &importer;
  std::vector<std::shared_ptr<IpcLease>> kept;
  {
    auto client = EncodeClient::Connect(co);
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    EncodeResult r = (*client)->Encode({ClientItem{Png(56, 56, 6)}, ClientItem{Png(84, 56, 7)}});
    ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    EXPECT_EQ(s->t.server->Stats().shm.sessions, 1);
    EXPECT_EQ(s->t.server->Stats().ipc.leases, 2);
    // Leases kept past the client are not released by it; its session's end
    // releases them on the server.
    for (ClientItemResult& item : r.items) {
      ASSERT_NE(item.ipc, nullptr);
      kept.push_back(std::move(item.ipc));
    }
  }
  ASSERT_TRUE(WaitFor([&] {
    const ServerStats st = s->t.server->Stats();
    return st.shm.sessions == 0 && st.ipc.leases == 0;
  }));
  const IpcStats st = s->t.server->Stats().ipc;
  EXPECT_EQ(st.session_reclaimed, 2u);
  EXPECT_EQ(st.exports, 0);
  EXPECT_EQ(st.expired, 0u);
  kept.clear();
}

TEST(IpcDeliveryTest, ClientImportsTheRowsAndReleasesOnDestruction) {
  auto s = StartIpcServer();
  FakeDevice importer;  // outlives the client and its leases
  const std::vector<std::string> images = {Png(56, 56, 1), Png(84, 56, 2)};
  ClientOptions co{.target = s->t.target};
  co.delivery = Delivery::kCudaIpc;
  co.ipc_device = &importer;
  auto client = EncodeClient::Connect(co);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  {
    EncodeResult r = (*client)->Encode({ClientItem{images[0]}, ClientItem{images[1]}});
    ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    for (std::size_t i = 0; i < images.size(); ++i) {
      const ClientItemResult& item = r.items[i];
      ASSERT_NE(item.ipc, nullptr);
      EXPECT_EQ(item.embedding, nullptr);
      EXPECT_EQ(item.shm, nullptr);
      const Embedding want = Expected(images[i]);
      EXPECT_EQ(item.ipc->shape(), want.shape());
      EXPECT_EQ(item.ipc->grid(), want.grid);
      EXPECT_EQ(item.ipc->nbytes(), want.nbytes());
      ASSERT_TRUE(item.ipc->WaitReady().ok());
      // FakeDevice memory is host-addressable.
      EXPECT_EQ(std::string(reinterpret_cast<const char*>(item.ipc->main()), item.ipc->main_bytes()),
                AsString(want.main));
      EXPECT_EQ(std::string(reinterpret_cast<const char*>(item.ipc->deepstack()), item.ipc->deepstack_bytes()),
                AsString(want.deepstack));
      EXPECT_EQ(item.ipc->server_device().rfind("fake", 0), 0u);
    }
    EXPECT_EQ(s->t.server->Stats().ipc.leases, 2);
  }  // both leases queued for release here
  ASSERT_TRUE((*client)->FlushReleases().ok());
  IpcStats st = s->t.server->Stats().ipc;
  EXPECT_EQ(st.leases, 0);
  EXPECT_EQ(st.released, 2u);

  // Explicit release; a second one is refused.
  EncodeResult r = (*client)->Encode({ClientItem{images[0]}});
  ASSERT_NE(r.items[0].ipc, nullptr);
  EXPECT_TRUE(r.items[0].ipc->Release().ok());
  EXPECT_EQ(r.items[0].ipc->Release().code(), StatusCode::kFailedPrecondition);
  // Stats reach the client with the CUDA IPC counters.
  StatusOr<ServerStats> remote = (*client)->Stats();
  ASSERT_TRUE(remote.ok());
  st = s->t.server->Stats().ipc;
  EXPECT_EQ(remote->ipc.items, st.items);
  EXPECT_EQ(remote->ipc.released, 3u);
  EXPECT_EQ(remote->ipc.refused_releases, 1u);
  EXPECT_EQ(remote->ipc.capacity_bytes, 8 << 20);
}

TEST(IpcDeliveryTest, BadReferencesAndHandlesGiveClearErrors) {
  // A client asking for CUDA IPC without an importing device.
  ClientOptions co{.target = "127.0.0.1:1"};
  co.delivery = Delivery::kCudaIpc;
  StatusOr<std::unique_ptr<EncodeClient>> c = EncodeClient::Connect(co);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("ipc_device"), std::string::npos);

  // A reference with a short handle, or a length that disagrees with the shape.
  v1::EncodedItem m;
  m.set_tokens(4);
  m.set_hidden(8);
  m.set_dtype(v1::DTYPE_FLOAT32);
  m.mutable_cuda_ipc()->set_memory_handle(std::string(10, 'x'));
  m.mutable_cuda_ipc()->set_event_handle(std::string(64, '\0'));
  m.mutable_cuda_ipc()->set_length(128);
  EmbeddingShape shape;
  GridTHW grid;
  IpcHandle handle;
  ClientItemResult r = internal::FromProtoIpc(m, &shape, &grid, &handle);
  EXPECT_EQ(r.status.code(), StatusCode::kInternal);
  EXPECT_NE(r.status.message().find("10-byte memory handle"), std::string::npos) << r.status.ToString();
  m.mutable_cuda_ipc()->set_memory_handle(std::string(64, 'x'));
  m.mutable_cuda_ipc()->set_length(100);
  r = internal::FromProtoIpc(m, &shape, &grid, &handle);
  EXPECT_EQ(r.status.code(), StatusCode::kInternal);
  EXPECT_NE(r.status.message().find("100 bytes"), std::string::npos) << r.status.ToString();
  m.mutable_cuda_ipc()->set_length(128);
  m.mutable_cuda_ipc()->set_deepstack_offset(128);
  r = internal::FromProtoIpc(m, &shape, &grid, &handle);
  EXPECT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(handle.bytes, 128u);
  EXPECT_EQ(handle.memory[0], 'x');

  // Handles the importing device refuses: not a FakeDevice's, and one naming
  // a descriptor that holds no export.
  FakeDevice importer;
  StatusOr<std::unique_ptr<IpcImport>> imp = importer.ImportIpc(handle);
  ASSERT_FALSE(imp.ok());
  EXPECT_EQ(imp.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(imp.status().message().find("not a FakeDevice"), std::string::npos) << imp.status().ToString();
  std::vector<std::byte> rows(64, std::byte{7});
  FakeDevice exporter;
  StatusOr<std::unique_ptr<IpcExport>> exp = exporter.ExportIpc(rows.data(), rows.size());
  ASSERT_TRUE(exp.ok());
  IpcHandle forged = (*exp)->handle();
  forged.memory[16] ^= 0x40;  // another descriptor number
  imp = importer.ImportIpc(forged);
  ASSERT_FALSE(imp.ok());
  EXPECT_EQ(imp.status().code(), StatusCode::kFailedPrecondition) << imp.status().ToString();
}

TEST(IpcDeliveryTest, StartRefusesBadIpcOptions) {
  FakeDevice dev;
  ServerOptions so;
  so.address = "127.0.0.1:0";
  so.ipc_device = &dev;
  so.ipc_export_bytes = -1;
  WorkerOptions wo;
  wo.model_id = "m";
  StatusOr<std::unique_ptr<EncodeServer>> s =
      EncodeServer::Start(so, wo, std::make_unique<FakeTower>(FakeTowerOptions{}, std::make_shared<FakeTowerState>()));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("ipc_export_bytes"), std::string::npos);
}

// IpcLeases alone, on a manual clock.
class IpcLeasesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StatusOr<DeviceBuffer> b = dev_.Allocate(256);
    ASSERT_TRUE(b.ok());
    rows_ = std::move(*b);
    std::memset(rows_.data(), 0x5c, rows_.size());
    StatusOr<std::unique_ptr<internal::IpcLeases>> l =
        internal::IpcLeases::Create(&dev_, 600, milliseconds(100), [this] { return now_; });
    ASSERT_TRUE(l.ok());
    leases_ = std::move(*l);
  }

  FakeDevice dev_;
  DeviceBuffer rows_;
  internal::IpcLeases::Clock::time_point now_{};
  std::unique_ptr<internal::IpcLeases> leases_;
};

TEST_F(IpcLeasesTest, LeasesExpireAtTheirDeadlineAndGenerationsAreNeverReused) {
  auto a = leases_->Acquire("key-a", rows_.data(), 256);
  ASSERT_TRUE(a.has_value());
  EXPECT_FALSE(a->reused);
  now_ += milliseconds(60);
  auto b = leases_->Acquire("key-a", rows_.data(), 256);
  ASSERT_TRUE(b.has_value());
  EXPECT_TRUE(b->reused);
  EXPECT_NE(a->generation, b->generation);
  EXPECT_EQ(a->handle.memory, b->handle.memory);
  now_ += milliseconds(40);  // a's deadline (100 ms) reached; b's at 160 ms
  IpcStats st = leases_->Stats();
  EXPECT_EQ(st.expired, 1u);
  EXPECT_EQ(st.leases, 1);
  EXPECT_EQ(st.exports, 1);
  EXPECT_EQ(leases_->Release(a->generation).code(), StatusCode::kFailedPrecondition);
  now_ += milliseconds(60);
  st = leases_->Stats();
  EXPECT_EQ(st.expired, 2u);
  EXPECT_EQ(st.exports, 0);
  EXPECT_EQ(st.exported_bytes, 0);
  // A new export of the same key gets a new generation, above every earlier one.
  auto c = leases_->Acquire("key-a", rows_.data(), 256);
  ASSERT_TRUE(c.has_value());
  EXPECT_GT(c->generation, b->generation);
  EXPECT_FALSE(c->reused);
  EXPECT_EQ(leases_->Stats().refused_releases, 1u);
}

TEST_F(IpcLeasesTest, TheBoundRefusesNewExportsButSharesLiveOnes) {
  auto a = leases_->Acquire("a", rows_.data(), 256);
  auto b = leases_->Acquire("b", rows_.data(), 256);
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_FALSE(leases_->Acquire("c", rows_.data(), 256).has_value());  // 768 > 600
  EXPECT_TRUE(leases_->Acquire("a", rows_.data(), 256).has_value());
  EXPECT_FALSE(leases_->Acquire("", rows_.data(), 601).has_value());  // larger than the bound
  ASSERT_TRUE(leases_->Release(b->generation).ok());
  EXPECT_TRUE(leases_->Acquire("c", rows_.data(), 256).has_value());
  const IpcStats st = leases_->Stats();
  EXPECT_EQ(st.exported_bytes, 512);
  EXPECT_EQ(st.exports, 2);
  EXPECT_EQ(st.leases, 3);
  EXPECT_EQ(st.released, 1u);
}

TEST_F(IpcLeasesTest, ReleaseOwnerEndsItsLeasesAndFreesExportsNoOtherLeaseHolds) {
  const std::uint64_t owner = leases_->OpenOwner();
  EXPECT_NE(owner, 0u);
  auto a = leases_->Acquire("a", rows_.data(), 256);
  auto b1 = leases_->Acquire("b", rows_.data(), 256);
  auto b2 = leases_->Acquire("b", rows_.data(), 256);  // b's export, a second lease
  auto c = leases_->Acquire("", rows_.data(), 64);     // never shared
  ASSERT_TRUE(a && b1 && b2 && c);
  EXPECT_TRUE(leases_->Adopt(a->generation, owner));
  EXPECT_TRUE(leases_->Adopt(b1->generation, owner));
  EXPECT_TRUE(leases_->Adopt(c->generation, owner));
  EXPECT_FALSE(leases_->Adopt(a->generation, owner));       // under an owner already
  EXPECT_FALSE(leases_->Adopt(b2->generation, owner + 1));  // never opened
  IpcStats st = leases_->Stats();
  EXPECT_EQ(st.exports, 3);
  EXPECT_EQ(st.exported_bytes, 256 + 256 + 64);
  ASSERT_TRUE(leases_->Release(c->generation).ok());  // leaves the owner's set; c's export goes with it
  EXPECT_EQ(leases_->Stats().exports, 2);

  EXPECT_EQ(leases_->ReleaseOwner(owner), 2u);  // a and b1
  st = leases_->Stats();
  EXPECT_EQ(st.leases, 1);   // b2
  EXPECT_EQ(st.exports, 1);  // b's, held by b2; a's freed with its only lease
  EXPECT_EQ(st.exported_bytes, 256);
  EXPECT_EQ(st.session_reclaimed, 2u);
  EXPECT_EQ(st.released, 1u);
  EXPECT_EQ(st.expired, 0u);
  EXPECT_EQ(leases_->Release(a->generation).code(), StatusCode::kFailedPrecondition);
  // Retired: nothing more to end, and nothing to adopt under it.
  EXPECT_EQ(leases_->ReleaseOwner(owner), 0u);
  EXPECT_FALSE(leases_->Adopt(b2->generation, owner));
  // A new lease on "a" makes a new export.
  auto again = leases_->Acquire("a", rows_.data(), 256);
  ASSERT_TRUE(again.has_value());
  EXPECT_FALSE(again->reused);
}

TEST_F(IpcLeasesTest, AnOwnedLeaseStillExpiresAndItsOwnerThenHasNothingToEnd) {
  const std::uint64_t owner = leases_->OpenOwner();
  auto a = leases_->Acquire("a", rows_.data(), 256);
  ASSERT_TRUE(a.has_value());
  ASSERT_TRUE(leases_->Adopt(a->generation, owner));
  now_ += milliseconds(100);  // the lease time
  EXPECT_EQ(leases_->ReleaseOwner(owner), 0u);
  const IpcStats st = leases_->Stats();
  EXPECT_EQ(st.expired, 1u);
  EXPECT_EQ(st.session_reclaimed, 0u);
  EXPECT_EQ(st.exports, 0);
}

TEST_F(IpcLeasesTest, AFailedExportIsReportedAndNothingIsLeased) {
  Status err;
  EXPECT_FALSE(leases_->Acquire("a", nullptr, 16, &err).has_value());
  EXPECT_EQ(err.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(leases_->Stats().leases, 0);
  EXPECT_FALSE(internal::IpcLeases::Create(nullptr, 1, milliseconds(1)).ok());
  EXPECT_FALSE(internal::IpcLeases::Create(&dev_, 0, milliseconds(1)).ok());
}

}  // namespace
}  // namespace epd::testing
