// src/client/client_convert.h (internal to epd::client): an EncodedItem as
// the client's ClientItemResult. Kept out of proto_convert.h, which the
// server shares, so that the rpc layer never includes the client's header.
#pragma once

#include "epd/client/client.h"
#include "epd/v1/encoder.pb.h"

namespace epd::internal {

// Copies the payload and grid_thw into a fresh Embedding. A message whose
// byte sizes disagree with its shape, or whose grid_thw is neither empty nor
// 3 positive values, becomes a kInternal item status; an item the server
// failed keeps the server's code and message.
ClientItemResult FromProto(const v1::EncodedItem& m);

// A Probe reply's item: the server's failure as the item's status (prefixed
// "item <i>: "), a key or route key that is not 32 bytes or a malformed
// grid_thw as kInternal.
ClientProbeItem FromProto(const v1::ProbedItem& m);

// For an item sent by reference (m.has_shm()): the result without its rows
// (embedding and shm null), plus the rows' shape and grid. kInternal item
// status when the span does not fit the arena or its length disagrees with
// the shape; the server's status when the item failed.
ClientItemResult FromProtoShm(const v1::EncodedItem& m, EmbeddingShape* shape, GridTHW* grid);

}  // namespace epd::internal

namespace epd::internal {

// For an item sent by CUDA IPC (m.has_cuda_ipc()): the result without its
// rows, plus the rows' shape and grid and the handle to import. kInternal
// item status when a handle is not 64 bytes, or the length or deepstack
// offset disagrees with the shape; the server's status when the item failed.
ClientItemResult FromProtoIpc(const v1::EncodedItem& m, EmbeddingShape* shape, GridTHW* grid, IpcHandle* handle);

}  // namespace epd::internal
