// The Probe RPC and the front door's probe (proto/epd/v1/encoder.proto,
// epd/server/front_door.h). A probe passes exactly the checks an Encode
// call passes before the worker (the caller's credential and tenant, the
// request's size and shape, the in-flight budget for its bytes while it is
// probed), then ProbeItems (epd/worker/item_probe.h) on the calling thread:
// it only reads headers, so it needs none of the worker loop's state and
// never waits behind a tower batch.
#include <chrono>

#include "encode_items.h"
#include "epd/server/front_door.h"
#include "epd/server/request_shape.h"
#include "server_impl.h"

namespace epd {
namespace {

void ToProto(const StatusOr<ItemProbe>& p, std::int64_t index, v1::ProbedItem* out) {
  out->set_index(index);
  if (!p.ok()) {
    out->set_error_code(static_cast<int>(p.status().code()));
    out->set_error_message(p.status().message());
    return;
  }
  out->set_key(reinterpret_cast<const char*>(p->key.bytes.data()), p->key.bytes.size());
  out->set_route_key(reinterpret_cast<const char*>(p->route_key.bytes.data()), p->route_key.bytes.size());
  if (p->grid.known()) {
    out->add_grid_thw(p->grid.t);
    out->add_grid_thw(p->grid.h);
    out->add_grid_thw(p->grid.w);
  }
  out->set_tokens(p->tokens);
}

}  // namespace

StatusOr<std::vector<StatusOr<ItemProbe>>> ServerFrontDoor::Probe(EncodeRequest request,
                                                                  const CallerIdentity& caller) const {
  if (!s_->serving.load()) return Status(StatusCode::kUnavailable, "the server is shutting down");
  request.tenant = caller.share;
  request.key_namespace = caller.key_namespace;
  return ProbeItems(s_->worker_options, request);
}

grpc::Status EncodeServer::Impl::Probe(grpc::ServerContext* ctx, const v1::EncodeRequest* req, v1::ProbeResponse* out) {
  StatusOr<internal::Caller> caller = tenants->Identify(*ctx);
  if (!caller.ok()) return internal::ToGrpc(caller.status());
  const auto bytes = static_cast<std::int64_t>(req->ByteSizeLong());
  // Size, items, kinds and id: the rules every front shares (request_shape.h).
  if (Status st =
          CheckRequestShape(internal::ShapeOf(*req, bytes), {options.max_items_per_request, options.max_request_bytes});
      !st.ok()) {
    return internal::ToGrpc(st);
  }
  if (ctx->deadline() <= std::chrono::system_clock::now()) {
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "the call's deadline passed before the probe began");
  }
  const ServerFrontDoor door(this);
  if (Status st = door.TakeBudget(bytes); !st.ok()) return internal::ToGrpc(st);
  EncodeRequest request;
  request.items.reserve(static_cast<std::size_t>(req->items_size()));
  // The bytes move out of the message, as Encode's do: it is this call's.
  for (v1::EncodeItem& item : *const_cast<v1::EncodeRequest*>(req)->mutable_items()) {
    request.items.push_back(internal::ItemFromProto(std::move(item), worker_options.video_sampling));
  }
  StatusOr<std::vector<StatusOr<ItemProbe>>> probed = door.Probe(std::move(request), *caller);
  door.ReleaseBudget(bytes);
  if (!probed.ok()) return internal::ToGrpc(probed.status());
  out->set_server_id(options.server_id);
  for (std::size_t i = 0; i < probed->size(); ++i) {
    ToProto((*probed)[i], static_cast<std::int64_t>(i), out->add_items());
  }
  return grpc::Status::OK;
}

}  // namespace epd
