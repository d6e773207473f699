// `epd-encode health`: one call of gRPC's standard health service
// (grpc.health.v1.Health/Check) against a running `serve`, for a container's
// HEALTHCHECK and for scripts (deploy/oci/Containerfile, docs/DEPLOY.md).
//
//   epd-encode health [--server HOST:PORT] [--service NAME] [--timeout-s S]
//
// Prints the status (SERVING, NOT_SERVING, SERVICE_UNKNOWN, UNKNOWN) on
// stdout and exits 0 only for SERVING; 1 for any other status or a failed
// call ("<CODE_NAME>: <message>" on stderr). Plaintext only, like Kubernetes'
// own gRPC probe: a probe runs beside the server, on its loopback.
//
// Why no generated stubs: Debian ships neither health.proto nor its C++
// code, and the messages are one field each. HealthCheckRequest is
// {string service = 1}; HealthCheckResponse is {ServingStatus status = 1},
// an enum (a varint). tests/python/grpc_wire.py speaks the same subset.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "commands.h"
#include "epd/client/client.h"

namespace epd::cli {
namespace {

struct HealthFlags {
  std::string server = "127.0.0.1:50051";
  std::string service;  // "" = the whole server
  double timeout_s = 3;
};

// HealthCheckRequest{service}: field 1, wire type 2 (tag byte 0x0A).
std::string EncodeHealthRequest(const std::string& service) {
  if (service.empty()) return {};
  std::string out(1, '\x0A');
  for (std::size_t n = service.size();; n >>= 7) {
    out.push_back(static_cast<char>((n & 0x7F) | (n > 0x7F ? 0x80 : 0)));
    if (n <= 0x7F) break;
  }
  return out + service;
}

// The status of a HealthCheckResponse: field 1 as a varint (tag byte 0x08);
// -1 when the bytes are not that message.
int DecodeHealthStatus(const std::string& bytes) {
  if (bytes.empty()) return 0;  // proto3 leaves the default (UNKNOWN) out
  if (bytes.size() < 2 || bytes[0] != '\x08') return -1;
  const auto v = static_cast<unsigned char>(bytes[1]);
  return (v & 0x80) != 0 ? -1 : static_cast<int>(v);
}

const char* StatusName(int status) {
  switch (status) {
    case 0:
      return "UNKNOWN";
    case 1:
      return "SERVING";
    case 2:
      return "NOT_SERVING";
    case 3:
      return "SERVICE_UNKNOWN";
    default:
      return "UNRECOGNISED";
  }
}

grpc::Status CallCheck(const HealthFlags& f, std::string* reply_bytes) {
  grpc::GenericStub stub(grpc::CreateChannel(f.server, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<std::int64_t>(f.timeout_s * 1000)));
  grpc::CompletionQueue cq;
  const std::string request = EncodeHealthRequest(f.service);
  grpc::Slice slice(request);
  grpc::ByteBuffer request_buffer(&slice, 1), reply;
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> call =
      stub.PrepareUnaryCall(&ctx, "/grpc.health.v1.Health/Check", request_buffer, &cq);
  call->StartCall();
  grpc::Status status;
  call->Finish(&reply, &status, nullptr);
  void* tag = nullptr;
  bool ok = false;
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  if (!status.ok()) return status;
  grpc::Slice whole;
  if (!reply.TrySingleSlice(&whole).ok() && !reply.DumpToSingleSlice(&whole).ok()) {
    return {grpc::StatusCode::INTERNAL, "cannot read the reply's bytes"};
  }
  reply_bytes->assign(reinterpret_cast<const char*>(whole.begin()), whole.size());
  return grpc::Status::OK;
}

int RunHealth(const HealthFlags& f) {
  std::string bytes;
  if (grpc::Status s = CallCheck(f, &bytes); !s.ok()) {
    const std::string code = GrpcStatusName(static_cast<StatusCode>(s.error_code()));
    std::fprintf(stderr, "%s: grpc.health.v1.Health/Check on %s: %s\n", code.c_str(), f.server.c_str(),
                 s.error_message().c_str());
    return 1;
  }
  const int status = DecodeHealthStatus(bytes);
  if (status < 0) return CommandError("health", "the reply from " + f.server + " is not a HealthCheckResponse");
  std::printf("%s\n", StatusName(status));
  return status == 1 ? 0 : 1;
}

}  // namespace

void RegisterHealthCommand(CLI::App& app) {
  auto f = std::make_shared<HealthFlags>();
  CLI::App* cmd = app.add_subcommand(
      "health", "ask a server's standard gRPC health service (grpc.health.v1) once; exit 0 only when SERVING");
  cmd->add_option("--server", f->server, "HOST:PORT of `epd-encode serve`")->capture_default_str();
  cmd->add_option("--service", f->service, "service to ask about (\"\" = the whole server, or epd.v1.Encoder)");
  cmd->add_option("--timeout-s", f->timeout_s, "deadline of the call, s")
      ->capture_default_str()
      ->check(CLI::Range(0.001, 3600.0));
  cmd->callback([f] {
    if (const int rc = RunHealth(*f); rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace epd::cli
