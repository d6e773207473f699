#include "ipc_delivery.h"

#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <utility>

#include "proto_convert.h"
#include "shm_delivery.h"

namespace epd::internal {

int CudaOrdinal(const std::string& description) {
  if (description.rfind("cuda:", 0) != 0) return -1;
  std::size_t i = 5;
  int n = 0;
  if (i >= description.size() || description[i] < '0' || description[i] > '9') return -1;
  while (i < description.size() && description[i] >= '0' && description[i] <= '9' && n < 100000) {
    n = n * 10 + (description[i++] - '0');
  }
  return n;
}

bool ToProtoByIpc(IpcLeases& ipc, const std::string& device, const ItemResult& r, const std::string& server_id,
                  v1::EncodedItem* out, std::uint64_t owner) {
  if (!r.status.ok() || r.embedding == nullptr) return false;
  const Embedding& e = *r.embedding;
  if (e.resident == nullptr || e.resident->location() != "device") {
    ipc.CountFallback(/*not_resident=*/true);
    return false;
  }
  // The L1 entry's own fill (an upload, a promotion or adopted tower rows)
  // must have landed before the export copies it; for a hit it has.
  if (Status s = e.resident->Wait(); !s.ok()) {
    ipc.CountFallback(/*not_resident=*/false);
    return false;
  }
  const std::string key(reinterpret_cast<const char*>(r.key.bytes.data()), r.key.bytes.size());
  const std::uint64_t length = e.ExpectedBytes();
  std::optional<IpcLeases::Lease> lease = ipc.Acquire(key, e.resident->data(), length);
  if (!lease.has_value()) {
    ipc.CountFallback(/*not_resident=*/false);
    return false;
  }
  ipc.CountItem(lease->reused);

  v1::CudaIpcRef ref;
  ref.set_memory_handle(reinterpret_cast<const char*>(lease->handle.memory.data()), lease->handle.memory.size());
  ref.set_event_handle(reinterpret_cast<const char*>(lease->handle.event.data()), lease->handle.event.size());
  ref.set_length(length);
  ref.set_deepstack_offset(e.main_bytes());
  ref.set_device(device);
  ref.set_device_index(CudaOrdinal(device));
  ref.set_pid(static_cast<std::int64_t>(getpid()));
  ref.set_generation(lease->generation);
  ref.set_lease_ms(ipc.lease().count());
  if (owner != 0) ref.set_in_session(ipc.Adopt(lease->generation, owner));

  // ToProto writes the header fields; it is handed a shape-only host
  // Embedding (no bytes, so no device-to-host copy) and a placement that
  // always succeeds with the reference made above.
  auto shape_only = std::make_shared<Embedding>();
  static_cast<EmbeddingShape&>(*shape_only) = e.shape();
  shape_only->grid = e.grid;
  ItemResult header = r;
  header.embedding = std::move(shape_only);
  ToProto(header, server_id, out, [&ref](const Embedding&, v1::EncodedItem* m) {
    *m->mutable_cuda_ipc() = std::move(ref);
    return true;
  });
  return true;
}

std::uint32_t ReleaseAnyLeases(ShmArena* arena, IpcLeases* ipc,
                               const google::protobuf::RepeatedPtrField<v1::ShmLease>& leases, Status* first_refusal) {
  std::uint32_t released = 0;
  *first_refusal = Status::Ok();
  for (const v1::ShmLease& l : leases) {
    Status s;
    if (l.kind() == v1::LEASE_KIND_CUDA_IPC) {
      s = ipc != nullptr ? ipc->Release(l.generation())
                         : FailedPrecondition(
                               "this server has no CUDA IPC delivery (start it with --ipc-export-mb "
                               "and a GPU tier); there is nothing to release");
    } else {
      s = ReleaseShmLease(arena, l);
    }
    if (s.ok()) {
      ++released;
    } else if (first_refusal->ok()) {
      *first_refusal = s;
    }
  }
  return released;
}

}  // namespace epd::internal
