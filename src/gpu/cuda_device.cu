// CudaDevice: epd::Device over the CUDA runtime. See epd/gpu_cuda/cuda_device.h.
//
// Stream ordering of device memory: buffers come from cudaMallocAsync on the
// onboard stream. Every use of a device buffer is ordered after that
// allocation: the onboard stream uses it in stream order, and the offload
// stream only touches a device buffer after waiting (StreamWaitEvent) for, or
// host-observing, an event recorded on the onboard stream after its fill
// copy. Frees go through cudaFreeAsync on the onboard stream, and only once
// every copy touching the buffer has completed (Device::ReleaseAfter), so the
// free needs no further ordering.
//
// Every entry point makes the device current (DeviceGuard) and restores the
// caller's device after: the runtime's current device is per thread, and
// buffers may be freed on any reader's thread.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#include "epd/gpu/host_memory_pool.h"
#include "epd/gpu_cuda/cuda_device.h"

namespace epd {
namespace {

Status CudaError(cudaError_t err, const char* what) {
  return Internal(std::string(what) + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

cudaStream_t* StreamSlot(cudaStream_t (&streams)[2], Stream s) { return &streams[static_cast<int>(s)]; }

// Makes `device` current for a scope and restores the caller's current
// device after: entry points run on the caller's threads (a reader freeing an
// entry, the tower's thread), whose own current device must not change.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) cudaSetDevice(device);
  }
  ~DeviceGuard() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

class CudaEvent final : public Event {
 public:
  CudaEvent(int device, cudaEvent_t event) : device_(device), event_(event) {}
  ~CudaEvent() override {
    DeviceGuard guard(device_);
    cudaEventDestroy(event_);
  }
  bool Query() const override {
    DeviceGuard guard(device_);
    // Any status other than "not ready" ends the wait: success, or an error
    // that Synchronize() reports (a failed copy will never complete).
    return cudaEventQuery(event_) != cudaErrorNotReady;
  }
  Status Synchronize() const override {
    DeviceGuard guard(device_);
    const cudaError_t err = cudaEventSynchronize(event_);
    return err == cudaSuccess ? Status::Ok() : CudaError(err, "cudaEventSynchronize");
  }
  cudaEvent_t get() const { return event_; }

 private:
  const int device_;
  const cudaEvent_t event_;
};

// IPC (epd/gpu/device.h). The exported rows live in their own cudaMalloc
// allocation: memory from the stream-ordered pool cannot be shared with
// cudaIpcGetMemHandle, and a private copy also lets the L1 entry be evicted
// while an importer still reads. The interprocess event marks the copy's
// completion on the onboard stream.
class CudaIpcExport final : public IpcExport {
 public:
  CudaIpcExport(int device, void* rows, cudaEvent_t event, IpcHandle handle)
      : device_(device), rows_(rows), event_(event), handle_(handle) {}
  ~CudaIpcExport() override {
    DeviceGuard guard(device_);
    if (event_ != nullptr) {
      cudaEventSynchronize(event_);  // the copy into rows_ must land before the free
      cudaEventDestroy(event_);
    }
    if (rows_ != nullptr) cudaFree(rows_);
  }
  const IpcHandle& handle() const override { return handle_; }

 private:
  const int device_;
  void* const rows_;
  const cudaEvent_t event_;
  const IpcHandle handle_;
};

class CudaIpcImport final : public IpcImport {
 public:
  CudaIpcImport(int device, void* rows, std::size_t bytes, cudaEvent_t event)
      : device_(device), rows_(rows), bytes_(bytes), event_(event) {}
  ~CudaIpcImport() override {
    DeviceGuard guard(device_);
    if (event_ != nullptr) cudaEventDestroy(event_);
    cudaIpcCloseMemHandle(rows_);
  }
  const std::byte* data() const override { return static_cast<const std::byte*>(rows_); }
  std::size_t size() const override { return bytes_; }
  Status WaitReady() const override {
    if (event_ == nullptr) return Status::Ok();
    DeviceGuard guard(device_);
    const cudaError_t err = cudaEventSynchronize(event_);
    return err == cudaSuccess ? Status::Ok() : CudaError(err, "cudaEventSynchronize (IPC event)");
  }

 private:
  const int device_;
  void* const rows_;
  const std::size_t bytes_;
  const cudaEvent_t event_;
};

class CudaDevice final : public Device {
 public:
  static StatusOr<std::unique_ptr<Device>> Open(const CudaDeviceOptions& options) {
    StatusOr<int> count = CudaDeviceCount();
    if (!count.ok()) return count.status();
    if (options.device_index < 0 || options.device_index >= *count) {
      return FailedPrecondition("CUDA device " + std::to_string(options.device_index) + " requested, " +
                                std::to_string(*count) + " present");
    }
    std::unique_ptr<CudaDevice> dev(new CudaDevice(options));
    if (Status st = dev->Init(); !st.ok()) return st;
    return std::unique_ptr<Device>(std::move(dev));
  }

  ~CudaDevice() override {
    DrainReleases();
    DeviceGuard guard(options_.device_index);
    for (cudaStream_t& s : streams_) {
      if (s != nullptr) {
        cudaStreamSynchronize(s);
        cudaStreamDestroy(s);
      }
    }
    pool_.reset();
    if (arena_ != nullptr) cudaFreeHost(arena_);
  }

  std::string Describe() const override { return description_; }

  Status CopyAsync(void* dst, const void* src, std::size_t bytes, CopyKind kind, Stream stream) override {
    if (bytes == 0) return Status::Ok();
    if (dst == nullptr || src == nullptr) {
      return InvalidArgument("CopyAsync: null " + std::string(dst == nullptr ? "dst" : "src") + " for " +
                             std::to_string(bytes) + " bytes");
    }
    DeviceGuard guard(options_.device_index);
    const cudaMemcpyKind k = kind == CopyKind::kHostToDevice   ? cudaMemcpyHostToDevice
                             : kind == CopyKind::kDeviceToHost ? cudaMemcpyDeviceToHost
                                                               : cudaMemcpyDeviceToDevice;
    const cudaError_t err = cudaMemcpyAsync(dst, src, bytes, k, *StreamSlot(streams_, stream));
    return err == cudaSuccess ? Status::Ok() : CudaError(err, "cudaMemcpyAsync");
  }

  Status StreamWaitEvent(Stream stream, const Event& event) override {
    const auto* ev = dynamic_cast<const CudaEvent*>(&event);
    if (ev == nullptr) return InvalidArgument("StreamWaitEvent: the event was not recorded on a CUDA device");
    DeviceGuard guard(options_.device_index);
    const cudaError_t err = cudaStreamWaitEvent(*StreamSlot(streams_, stream), ev->get(), 0);
    return err == cudaSuccess ? Status::Ok() : CudaError(err, "cudaStreamWaitEvent");
  }

  Status Synchronize(Stream stream) override {
    DeviceGuard guard(options_.device_index);
    const cudaError_t err = cudaStreamSynchronize(*StreamSlot(streams_, stream));
    return err == cudaSuccess ? Status::Ok() : CudaError(err, "cudaStreamSynchronize");
  }

  StatusOr<std::unique_ptr<IpcExport>> ExportIpc(const void* device_src, std::size_t bytes) override {
    static_assert(sizeof(cudaIpcMemHandle_t) == IpcHandle::kHandleBytes);
    static_assert(sizeof(cudaIpcEventHandle_t) == IpcHandle::kHandleBytes);
    if (device_src == nullptr || bytes == 0) return InvalidArgument("ExportIpc needs a non-null source and bytes > 0");
    DeviceGuard guard(options_.device_index);
    cudaStream_t onboard = *StreamSlot(streams_, Stream::kOnboard);
    void* rows = nullptr;
    cudaError_t err = cudaMalloc(&rows, bytes);
    if (err != cudaSuccess) {
      cudaGetLastError();
      return CudaError(err, "cudaMalloc (IPC export)");
    }
    cudaEvent_t event = nullptr;
    err = cudaEventCreateWithFlags(&event, cudaEventInterprocess | cudaEventDisableTiming);
    if (err != cudaSuccess) {
      cudaFree(rows);
      return CudaError(err, "cudaEventCreateWithFlags (interprocess)");
    }
    // From here on the export owns rows and event (its destructor frees them).
    IpcHandle handle;
    handle.bytes = bytes;
    auto fail = [&](cudaError_t e, const char* what) -> Status {
      CudaIpcExport cleanup(options_.device_index, rows, event, handle);
      return CudaError(e, what);
    };
    if ((err = cudaMemcpyAsync(rows, device_src, bytes, cudaMemcpyDeviceToDevice, onboard)) != cudaSuccess) {
      return fail(err, "cudaMemcpyAsync (IPC export)");
    }
    if ((err = cudaEventRecord(event, onboard)) != cudaSuccess) return fail(err, "cudaEventRecord (IPC export)");
    cudaIpcMemHandle_t mem{};
    if ((err = cudaIpcGetMemHandle(&mem, rows)) != cudaSuccess) return fail(err, "cudaIpcGetMemHandle");
    cudaIpcEventHandle_t ev{};
    if ((err = cudaIpcGetEventHandle(&ev, event)) != cudaSuccess) return fail(err, "cudaIpcGetEventHandle");
    std::memcpy(handle.memory.data(), &mem, sizeof(mem));
    std::memcpy(handle.event.data(), &ev, sizeof(ev));
    return std::unique_ptr<IpcExport>(new CudaIpcExport(options_.device_index, rows, event, handle));
  }

  StatusOr<std::unique_ptr<IpcImport>> ImportIpc(const IpcHandle& handle) override {
    if (handle.bytes == 0) return InvalidArgument("ImportIpc: the handle shares 0 bytes");
    DeviceGuard guard(options_.device_index);
    cudaIpcMemHandle_t mem{};
    std::memcpy(&mem, handle.memory.data(), sizeof(mem));
    void* rows = nullptr;
    cudaError_t err = cudaIpcOpenMemHandle(&rows, mem, cudaIpcMemLazyEnablePeerAccess);
    if (err != cudaSuccess) {
      cudaGetLastError();
      return CudaError(err, "cudaIpcOpenMemHandle");
    }
    cudaEvent_t event = nullptr;
    bool has_event = false;
    for (std::uint8_t b : handle.event) has_event = has_event || b != 0;
    if (has_event) {
      cudaIpcEventHandle_t ev{};
      std::memcpy(&ev, handle.event.data(), sizeof(ev));
      err = cudaIpcOpenEventHandle(&event, ev);
      if (err != cudaSuccess) {
        cudaIpcCloseMemHandle(rows);
        return CudaError(err, "cudaIpcOpenEventHandle");
      }
    }
    return std::unique_ptr<IpcImport>(new CudaIpcImport(options_.device_index, rows, handle.bytes, event));
  }

 protected:
  StatusOr<std::byte*> DoAllocate(MemoryKind kind, std::size_t bytes) override {
    if (kind == MemoryKind::kPinnedHost) {
      if (pool_ == nullptr) return static_cast<std::byte*>(nullptr);
      return pool_->Allocate(bytes);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (options_.device_bytes_limit != 0 && device_in_use_ + bytes > options_.device_bytes_limit) {
        return static_cast<std::byte*>(nullptr);
      }
      device_in_use_ += bytes;  // reserved now, so two threads cannot both pass the check
    }
    DeviceGuard guard(options_.device_index);
    void* p = nullptr;
    const cudaError_t err = memory_pools_ ? cudaMallocAsync(&p, bytes, streams_[0]) : cudaMalloc(&p, bytes);
    if (err != cudaSuccess) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        device_in_use_ -= bytes;
      }
      if (err == cudaErrorMemoryAllocation) {
        cudaGetLastError();  // not sticky; clear it so later calls do not see it
        return static_cast<std::byte*>(nullptr);
      }
      return CudaError(err, memory_pools_ ? "cudaMallocAsync" : "cudaMalloc");
    }
    return static_cast<std::byte*>(p);
  }

  void DoFree(MemoryKind kind, std::byte* p, std::size_t bytes) noexcept override {
    if (kind == MemoryKind::kPinnedHost) {
      pool_->Free(p);
      return;
    }
    DeviceGuard guard(options_.device_index);
    const cudaError_t err = memory_pools_ ? cudaFreeAsync(p, streams_[0]) : cudaFree(p);
    if (err != cudaSuccess) {
      // A destructor cannot report it; a failing device fails the next call too.
      std::fprintf(stderr, "epd::CudaDevice: freeing %zu device bytes failed: %s\n", bytes, cudaGetErrorString(err));
    }
    std::lock_guard<std::mutex> lock(mu_);
    device_in_use_ -= bytes;
  }

  StatusOr<EventPtr> DoRecordEvent(Stream stream) override {
    DeviceGuard guard(options_.device_index);
    cudaEvent_t ev = nullptr;
    cudaError_t err = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (err != cudaSuccess) return CudaError(err, "cudaEventCreateWithFlags");
    auto event = std::make_shared<const CudaEvent>(options_.device_index, ev);
    err = cudaEventRecord(ev, *StreamSlot(streams_, stream));
    if (err != cudaSuccess) return CudaError(err, "cudaEventRecord");
    return EventPtr(std::move(event));
  }

  void AddMemoryStats(DeviceMemoryStats* stats) const override {
    stats->device_capacity_bytes = options_.device_bytes_limit;
    if (pool_ != nullptr) {
      const HostMemoryPoolStats p = pool_->stats();
      stats->pinned_capacity_bytes = p.capacity_bytes;
      stats->pinned_bytes_in_use = p.bytes_in_use;
      stats->pinned_largest_free_block = p.largest_free_block;
    }
  }

 private:
  explicit CudaDevice(const CudaDeviceOptions& options) : options_(options) {}

  Status Init() {
    DeviceGuard guard(options_.device_index);
    int current = -1;
    cudaError_t err = cudaGetDevice(&current);
    if (err != cudaSuccess) return CudaError(err, "cudaGetDevice");
    if (current != options_.device_index) {
      return Internal("cannot make CUDA device " + std::to_string(options_.device_index) +
                      " current: " + cudaGetErrorString(cudaGetLastError()));
    }
    cudaDeviceProp prop{};
    err = cudaGetDeviceProperties(&prop, options_.device_index);
    if (err != cudaSuccess) return CudaError(err, "cudaGetDeviceProperties");
    for (cudaStream_t& s : streams_) {
      err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      if (err != cudaSuccess) return CudaError(err, "cudaStreamCreateWithFlags");
    }
    int pools = 0;
    err = cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, options_.device_index);
    memory_pools_ = err == cudaSuccess && pools != 0;
    if (memory_pools_) {
      // Keep freed blocks in the pool instead of returning them to the driver
      // at every synchronisation: L1 churns constantly.
      cudaMemPool_t pool = nullptr;
      err = cudaDeviceGetDefaultMemPool(&pool, options_.device_index);
      if (err != cudaSuccess) return CudaError(err, "cudaDeviceGetDefaultMemPool");
      std::uint64_t threshold = UINT64_MAX;
      err = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold);
      if (err != cudaSuccess) return CudaError(err, "cudaMemPoolSetAttribute");
    }
    if (options_.pinned_pool_bytes > 0) {
      void* arena = nullptr;
      err = cudaHostAlloc(&arena, options_.pinned_pool_bytes, cudaHostAllocPortable);
      if (err != cudaSuccess) {
        cudaGetLastError();
        return ResourceExhausted("cudaHostAlloc of a " + std::to_string(options_.pinned_pool_bytes) +
                                 "-byte pinned pool failed: " + cudaGetErrorString(err));
      }
      arena_ = static_cast<std::byte*>(arena);
      pool_ = std::make_unique<HostMemoryPool>(arena_, options_.pinned_pool_bytes);
    }
    description_ = "cuda:" + std::to_string(options_.device_index) + " (" + prop.name + ", pinned pool " +
                   std::to_string(options_.pinned_pool_bytes >> 20) + " MiB, " +
                   (memory_pools_ ? "stream-ordered allocator" : "cudaMalloc") + ")";
    return Status::Ok();
  }

  const CudaDeviceOptions options_;
  cudaStream_t streams_[2] = {nullptr, nullptr};  // by Stream
  bool memory_pools_ = false;
  std::byte* arena_ = nullptr;
  std::unique_ptr<HostMemoryPool> pool_;
  std::string description_;
  std::mutex mu_;
  std::size_t device_in_use_ = 0;
};

}  // namespace

StatusOr<int> CudaDeviceCount() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return FailedPrecondition(std::string("no usable CUDA device: ") + cudaGetErrorString(err));
  }
  return n;
}

StatusOr<std::unique_ptr<Device>> OpenCudaDevice(const CudaDeviceOptions& options) { return CudaDevice::Open(options); }

}  // namespace epd
