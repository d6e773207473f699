// The most small gRPC exchanges per second this machine allows, with no
// encode server in the way: the ceiling under any design that makes one
// gRPC call per item (docs/BENCHMARKS-server.md, "The ceiling of one call per
// item").
//
//   grpc_call_ceiling serve TARGET
//       an echo service on TARGET (host:port or unix:/path), gRPC's callback
//       API, generic (no protobuf): each message read is written back.
//   grpc_call_ceiling call|stream TARGET CALLERS SECONDS [BYTES]
//       CALLERS threads, one channel each, send BYTES (default 300, about an
//       Encode reply by shared-memory reference) and wait for the echo, for
//       SECONDS:
//         call:   a new call per exchange (as Encode: open, send, read, status);
//         stream: one bidirectional stream per caller, an exchange per message.
//       Prints exchanges per second.
//   grpc_call_ceiling touch
//       the cost of bench-server's read of a 2 MiB item (one float per 64-byte
//       line), items taken in turn from a 64 MiB set, as `--synthetic 32`.
//
// Run serve and the client on the same machine, as bench_shm.sh runs the
// encode server and bench-server.
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/byte_buffer.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr char kMethod[] = "/epd.bench.Echo/Echo";

class EchoReactor final : public grpc::ServerGenericBidiReactor {
 public:
  EchoReactor() { StartRead(&buffer_); }
  void OnReadDone(bool ok) override {
    if (!ok) return Finish(grpc::Status::OK);
    StartWrite(&buffer_);
  }
  void OnWriteDone(bool ok) override {
    if (!ok) return Finish(grpc::Status::CANCELLED);
    buffer_.Clear();
    StartRead(&buffer_);
  }
  void OnDone() override { delete this; }

 private:
  grpc::ByteBuffer buffer_;
};

class EchoService final : public grpc::CallbackGenericService {
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
    return new EchoReactor();
  }
};

int Serve(const std::string& target) {
  EchoService service;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(target, grpc::InsecureServerCredentials());
  builder.RegisterCallbackGenericService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) {
    std::fprintf(stderr, "cannot listen on %s\n", target.c_str());
    return 1;
  }
  std::printf("READY %s\n", target.c_str());
  std::fflush(stdout);
  server->Wait();
  return 0;
}

// One exchange at a time on `cq`, as a sync client would; false when the
// server ended the exchange.
bool Step(grpc::CompletionQueue& cq) {
  void* tag = nullptr;
  bool ok = false;
  return cq.Next(&tag, &ok) && ok;
}

void CallLoop(const std::string& target, bool stream, const std::string& payload, const std::atomic<bool>& stop,
              std::atomic<std::int64_t>& done) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection per caller
  auto channel = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::Slice slice(payload);
  if (stream) {
    grpc::ClientContext ctx;
    auto call = stub.PrepareCall(&ctx, kMethod, &cq);
    call->StartCall(nullptr);
    if (!Step(cq)) return;
    while (!stop.load(std::memory_order_relaxed)) {
      grpc::ByteBuffer out(&slice, 1), in;
      call->Write(out, nullptr);
      if (!Step(cq)) break;
      call->Read(&in, nullptr);
      if (!Step(cq)) break;
      done.fetch_add(1, std::memory_order_relaxed);
    }
    call->WritesDone(nullptr);
    Step(cq);
    grpc::Status status;
    call->Finish(&status, nullptr);
    Step(cq);
  } else {
    while (!stop.load(std::memory_order_relaxed)) {
      grpc::ClientContext ctx;
      auto call = stub.PrepareCall(&ctx, kMethod, &cq);
      call->StartCall(nullptr);
      if (!Step(cq)) break;
      grpc::ByteBuffer out(&slice, 1), in;
      call->WriteLast(out, grpc::WriteOptions(), nullptr);
      if (!Step(cq)) break;
      call->Read(&in, nullptr);
      if (!Step(cq)) break;
      grpc::Status status;
      call->Finish(&status, nullptr);
      Step(cq);
      done.fetch_add(1, std::memory_order_relaxed);
    }
  }
  cq.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq.Next(&tag, &ok)) {
  }
}

int Load(const std::string& target, bool stream, int callers, double seconds, std::size_t bytes) {
  const std::string payload(bytes, 'x');
  std::atomic<bool> stop{false};
  std::atomic<std::int64_t> done{0};
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(callers));
  for (int i = 0; i < callers; ++i) {
    threads.emplace_back([&] { CallLoop(target, stream, payload, stop, done); });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (std::thread& t : threads) t.join();
  std::printf("{\"mode\": \"%s\", \"callers\": %d, \"bytes\": %zu, \"exchanges_per_s\": %.0f}\n",
              stream ? "stream" : "call", callers, bytes, static_cast<double>(done.load()) / seconds);
  return 0;
}

int Touch() {
  constexpr std::size_t kItem = std::size_t{2} << 20, kItems = 32;
  constexpr int kReps = 2000;
  std::vector<char> rows(kItem * kItems);
  for (std::size_t i = 0; i < rows.size(); i += 64) rows[i] = static_cast<char>(i >> 6);
  float sum = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < kReps; ++r) {
    const char* item = rows.data() + static_cast<std::size_t>(r % kItems) * kItem;
    for (std::size_t b = 0; b + sizeof(float) <= kItem; b += 64) {
      float v;
      std::memcpy(&v, item + b, sizeof v);
      sum += v;
    }
  }
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / kReps;
  std::printf("{\"mode\": \"touch\", \"item_bytes\": %zu, \"us_per_item\": %.1f, \"checksum\": %g}\n", kItem, us, sum);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "serve" && argc == 3) return Serve(argv[2]);
  if ((mode == "call" || mode == "stream") && (argc == 5 || argc == 6)) {
    const int callers = std::atoi(argv[3]);
    const double seconds = std::atof(argv[4]);
    const long bytes = argc == 6 ? std::atol(argv[5]) : 300;
    if (callers < 1 || seconds <= 0 || bytes < 0) {
      std::fprintf(stderr, "CALLERS must be >= 1, SECONDS > 0 and BYTES >= 0\n");
      return 2;
    }
    return Load(argv[2], mode == "stream", callers, seconds, static_cast<std::size_t>(bytes));
  }
  if (mode == "touch" && argc == 2) return Touch();
  std::fprintf(stderr,
               "usage: grpc_call_ceiling serve TARGET\n"
               "       grpc_call_ceiling call|stream TARGET CALLERS SECONDS [BYTES]\n"
               "       grpc_call_ceiling touch\n");
  return 2;
}
