// src/server/standard_services.h (internal): the gRPC services operators'
// tools expect beside epd.v1.Encoder.
//
//   grpc.health.v1.Health        gRPC's standard health checking protocol
//     (Check and Watch), so Kubernetes gRPC probes and load balancers work
//     unchanged. Served by gRPC's default implementation; its status for ""
//     (the whole server) and for "epd.v1.Encoder" follows EncodeServer's
//     own: SERVING once started, NOT_SERVING from the moment Shutdown begins.
//     Our Health RPC stays, for the model and configuration details.
//   grpc.reflection.v1alpha.ServerReflection  lists the services and their
//     descriptors, so generic tools (grpcurl, grpc_cli) can call the API
//     without the .proto files.
//
// Neither asks for the bearer token (auth.h): probes carry none, and the
// schema reflection serves is the public proto. TLS, when on, covers them.
#pragma once

namespace grpc {
class Server;
}

namespace epd::internal {

// Turns both services on for every grpc::ServerBuilder constructed after the
// call (gRPC keeps both switches process-wide). Idempotent, thread-safe.
void EnableStandardServices();

// Sets the grpc.health.v1 status of "" and "epd.v1.Encoder".
void SetStandardHealth(grpc::Server& server, bool serving);

}  // namespace epd::internal
