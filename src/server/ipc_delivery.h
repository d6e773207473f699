// src/server/ipc_delivery.h (internal to epd::server): what DELIVERY_CUDA_IPC
// adds to the Encode and Release RPCs, between the proto messages and
// IpcLeases (docs/SHM.md, "CUDA IPC").
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "epd/core/embedding.h"
#include "epd/core/encode_types.h"
#include "epd/core/status.h"
#include "epd/v1/encoder.pb.h"
#include "ipc_leases.h"
#include "shm_arena.h"

namespace epd::internal {

// The CUDA ordinal in a Device::Describe() text ("cuda:N ..." -> N); -1 for
// any other device (FakeDevice). O(length).
int CudaOrdinal(const std::string& description);

// Fills `out` for a successful item `r` whose rows are device-resident (an
// Embedding whose ResidentBytes::location() is "device") with a lease on
// their CUDA IPC export, main/deepstack left empty, and the other fields as
// ToProto (proto_convert.h) sets them. Waits for the rows' own fill copy to
// land first (ResidentBytes::Wait). False, with `out` untouched, when the
// item failed, when its rows are not device-resident (counted as
// not_resident), when the export would pass the bound or ExportIpc fails
// (counted as a fallback): the caller then sends the item another way.
// `device` is ipc.device().Describe(), passed in to avoid a call per item.
// A nonzero `owner` (the IpcLeases owner of the call's lease session,
// shm_session.h) gets the lease (IpcLeases::Adopt); CudaIpcRef.in_session
// says whether it took.
bool ToProtoByIpc(IpcLeases& ipc, const std::string& device, const ItemResult& r, const std::string& server_id,
                  v1::EncodedItem* out, std::uint64_t owner = 0);

// Releases each lease with the store its kind names (shared-memory spans in
// `arena`, CUDA IPC exports in `ipc`; either may be null, which refuses the
// leases of its kind). Returns how many matched; `first_refusal` gets the
// status of the first refused lease in request order (OK when every lease
// matched). O(leases).
std::uint32_t ReleaseAnyLeases(ShmArena* arena, IpcLeases* ipc,
                               const google::protobuf::RepeatedPtrField<v1::ShmLease>& leases, Status* first_refusal);

}  // namespace epd::internal
