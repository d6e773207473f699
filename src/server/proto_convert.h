// src/server/proto_convert.h (internal): epd types <-> epd.v1 messages, shared
// by the server and the client so both sides agree on every mapping. The
// client's own result type is converted in client_convert.h (client layer).
//
// Status codes cross unchanged (StatusCode is numbered as grpc::StatusCode);
// a gRPC code epd has no name for (e.g. UNIMPLEMENTED) keeps its number.
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <string>
#include <string_view>

#include "epd/core/embedding.h"
#include "epd/core/encode_types.h"
#include "epd/core/status.h"
#include "epd/media/preprocess.h"
#include "epd/media/video.h"
#include "epd/rpc/server_stats.h"
#include "epd/v1/encoder.pb.h"

namespace epd::internal {

// The gRPC metadata header that carries an item's content key (hex) for
// hash-affinity routing. Lower case: HTTP/2 header names are.
inline constexpr char kRouteHeader[] = "x-epd-route";
// The Encode metadata header naming the caller's lease session (the
// Session RPC's id; docs/SHM.md, "Crashed clients").
inline constexpr char kSessionHeader[] = "x-epd-session";

v1::DType ToProto(DType d);
// kInvalidArgument for DTYPE_UNSPECIFIED or an unknown value.
StatusOr<DType> FromProto(v1::DType d);

v1::Source ToProto(ItemSource s);
ItemSource FromProto(v1::Source s);

void ToProto(const PreprocessConfig& cfg, v1::PreprocessConfig* out);
// kInvalidArgument when mean/std do not have 3 values.
StatusOr<PreprocessConfig> FromProto(const v1::PreprocessConfig& p);

// Fills `out` from a delivered item: the embedding's bytes are copied into
// the message (the one copy on the server side), or error_code/message set.
void ToProto(const ItemResult& r, const std::string& server_id, v1::EncodedItem* out);
// The same, except that a successful item's host embedding is first offered
// to `place_payload` (e.g. shared-memory delivery, shm_delivery.h): when it
// returns true it has placed the rows elsewhere and described them in `out`,
// and no bytes are copied into the message; false = inline bytes as above.
void ToProto(const ItemResult& r, const std::string& server_id, v1::EncodedItem* out,
             const std::function<bool(const Embedding&, v1::EncodedItem*)>& place_payload);
void ToProto(const ServerStats& s, v1::StatsResponse* out);
ServerStats FromProto(const v1::StatsResponse& m);

// A request's sampling over the server's defaults: each field left 0 (proto3's
// unset; for rotation, VIDEO_ROTATION_UNSET or an unknown value) keeps the
// default. Validation is the worker's (VideoSampling::Validate).
VideoSampling FromProto(const v1::VideoSampling& p, const VideoSampling& defaults);
void ToProto(const VideoSampling& s, v1::VideoSampling* out);

grpc::Status ToGrpc(const Status& s);
Status FromGrpc(const grpc::Status& s);

// "INVALID_ARGUMENT" etc. for every gRPC code 0..16, "CODE_<n>" otherwise.
std::string GrpcCodeName(int code);
// Inverse of GrpcCodeName for the names used as Stats map keys.
StatusCode CodeFromName(std::string_view name);

}  // namespace epd::internal
