// TorchScript vision tower: the only translation unit of the library that
// includes libtorch (each such unit costs ~13 s and ~760 MB to compile).
//
// Design notes.
// * Errors are translated once, here. Every libtorch call that can throw sits
//   inside a try block that turns c10::Error (and any std::exception) into a
//   Status, using what_without_backtrace() so messages stay one paragraph.
// * The contract is checked at both ends of the module. At load: the four int
//   attributes and a forward taking (pixel_values, grid_thw). After each
//   forward: a 2-tuple of floating tensors with exactly the shapes implied by
//   the grids. A tower that returns one row too many would otherwise shift
//   every later item's embedding in the batch by a row, silently.
// * The packed input is built with one memcpy per item into a tensor libtorch
//   owns; the items' buffers are only borrowed for the duration of Encode.
// * Outputs are converted to the requested dtype by libtorch (bfloat16 and
//   float16 round to nearest even) and then made contiguous on the host, so
//   TowerOutput's bytes are plain row-major arrays.
// * Memory: each forward allocates and frees tens of megabytes of
//   temporaries (the [n, n] attention scores alone are 6.7 MB per head for
//   one 512x512 image). With glibc's defaults these blocks are mapped,
//   unmapped or trimmed on every call, so every call page-faults them in
//   again (~30k minor faults, ~40% of the forward for the default tower).
//   TorchTowerOptions::tune_malloc raises the mmap and trim thresholds once,
//   so freed temporaries are reused. The peak RSS stays the same; the process
//   just does not hand the peak back between calls.
// * OpenMP keeps the thread count per calling thread, and the worker calls
//   Encode from its own thread, so Encode re-applies num_threads when the
//   calling thread's count differs (a cheap query).
#include "epd/torch_tower/torch_tower.h"

#include <ATen/Parallel.h>
#include <torch/cuda.h>
#include <torch/script.h>

#include <cstring>
#include <filesystem>
#include <limits>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "torch_common.h"

namespace epd {
namespace {

using internal::HostBytes;
using internal::ParseDevice;
using internal::ShapeString;
using internal::TorchMessage;
using internal::ToScalarType;
using internal::TuneMallocOnce;
using internal::ValidateTowerItems;

struct Metadata {
  std::int64_t patch_dim = 0;
  std::int64_t merge_size = 0;
  std::int64_t hidden = 0;
  std::int64_t deepstack_layers = 0;
  bool temporal_chunks_independent = false;  // optional bool attribute, default false
};

// The optional attribute `temporal_chunks_independent` (VisionTower's
// declaration of per-frame independence): absent = false; present, it must
// be a bool.
Status ReadChunkAttribute(const torch::jit::Module& module, const std::string& path, bool* out) {
  const char* name = "temporal_chunks_independent";
  if (!module.hasattr(name)) return Status::Ok();
  c10::IValue v = module.attr(name);
  if (!v.isBool()) {
    return InvalidArgument("TorchScript tower " + path + ": attribute '" + name + "' must be a bool, got " +
                           v.tagKind());
  }
  *out = v.toBool();
  return Status::Ok();
}

// Reads one int attribute of the contract; `min` is its smallest valid value.
Status ReadIntAttribute(const torch::jit::Module& module, const std::string& path, const std::string& name,
                        std::int64_t min, std::int64_t* out) {
  if (!module.hasattr(name)) {
    return InvalidArgument("TorchScript tower " + path + " has no attribute '" + name +
                           "' (the contract needs int attributes patch_dim, merge_size, "
                           "hidden_size, deepstack_layers; see docs/TOWER.md)");
  }
  c10::IValue v = module.attr(name);
  if (!v.isInt()) {
    return InvalidArgument("TorchScript tower " + path + ": attribute '" + name + "' must be an int, got " +
                           v.tagKind());
  }
  *out = v.toInt();
  if (*out < min) {
    return InvalidArgument("TorchScript tower " + path + ": attribute '" + name + "' = " + std::to_string(*out) +
                           ", must be >= " + std::to_string(min));
  }
  return Status::Ok();
}

class TorchScriptTower final : public VisionTower {
 public:
  TorchScriptTower(torch::jit::Module module, Metadata meta, c10::Device device, int num_threads, DType dtype,
                   bool output_on_device, std::string path)
      : module_(std::move(module)),
        meta_(meta),
        device_(device),
        num_threads_(num_threads),
        dtype_(dtype),
        output_on_device_(output_on_device),
        path_(std::move(path)) {}

  StatusOr<TowerOutput> Encode(std::span<const TowerItem> items) override;

  std::int64_t patch_dim() const override { return meta_.patch_dim; }
  std::int64_t merge_size() const override { return meta_.merge_size; }
  std::int64_t hidden() const override { return meta_.hidden; }
  std::int64_t deepstack_layers() const override { return meta_.deepstack_layers; }
  DType dtype() const override { return dtype_; }
  bool output_on_device() const override { return output_on_device_; }
  bool temporal_chunks_independent() const override { return meta_.temporal_chunks_independent; }
  std::string Describe() const override {
    return "torchscript:" + path_ + " (" + device_.str() + ", " + std::to_string(num_threads_) +
           (num_threads_ == 1 ? " thread" : " threads") + ", hidden " + std::to_string(meta_.hidden) + ", deepstack " +
           std::to_string(meta_.deepstack_layers) + ", " + std::string(DTypeName(dtype_)) + ")";
  }

 private:
  // Encode's steps: the items' rows and grid as tensors on the device; the
  // forward's result checked against the contract; the outputs converted
  // into `out` (host bytes, or device tensors it keeps alive).
  std::pair<at::Tensor, at::Tensor> PackInputs(std::span<const TowerItem> items, std::int64_t total_patches) const;
  Status CheckResult(const c10::IValue& result, std::int64_t total_tokens) const;
  void StoreOutputs(const c10::IValue& result, TowerOutput& out) const;
  // Checks one output tensor of forward against [rows, cols], floating dtype.
  Status CheckOutput(const c10::IValue& v, const char* name, std::int64_t rows, std::int64_t cols) const;

  torch::jit::Module module_;
  const Metadata meta_;
  const c10::Device device_;
  const int num_threads_;
  const DType dtype_;
  const bool output_on_device_;
  const std::string path_;
};

// Keeps a device-resident output's tensors alive (TowerOutput::device_owner).
struct DeviceOutputTensors {
  at::Tensor main;
  at::Tensor deepstack;
};

Status TorchScriptTower::CheckOutput(const c10::IValue& v, const char* name, std::int64_t rows,
                                     std::int64_t cols) const {
  const std::string expected = "[" + std::to_string(rows) + ", " + std::to_string(cols) + "]";
  if (!v.isTensor()) {
    return Internal("TorchScript tower " + path_ + ": forward's " + name + " output must be a Tensor, got " +
                    v.tagKind());
  }
  const at::Tensor& t = v.toTensor();
  if (t.dim() != 2 || t.size(0) != rows || t.size(1) != cols) {
    return Internal("TorchScript tower " + path_ + ": forward's " + name + " output has shape " + ShapeString(t) +
                    ", expected " + expected);
  }
  if (!at::isFloatingType(t.scalar_type())) {
    return Internal("TorchScript tower " + path_ + ": forward's " + name + " output has dtype " +
                    std::string(c10::toString(t.scalar_type())) + ", expected a floating type");
  }
  return Status::Ok();
}

std::pair<at::Tensor, at::Tensor> TorchScriptTower::PackInputs(std::span<const TowerItem> items,
                                                               std::int64_t total_patches) const {
  const std::int64_t n_items = static_cast<std::int64_t>(items.size());
  at::Tensor pixels = torch::empty({total_patches, meta_.patch_dim}, at::kFloat);
  at::Tensor grid = torch::empty({n_items, 3}, at::kLong);
  auto* dst = pixels.data_ptr<float>();
  auto* g = grid.data_ptr<std::int64_t>();
  for (const TowerItem& item : items) {
    const std::int64_t n = item.grid.patches() * meta_.patch_dim;
    std::memcpy(dst, item.patches, static_cast<std::size_t>(n) * sizeof(float));
    dst += n;
    *g++ = item.grid.t;
    *g++ = item.grid.h;
    *g++ = item.grid.w;
  }
  if (!device_.is_cpu()) {
    pixels = pixels.to(device_);
    grid = grid.to(device_);
  }
  return {pixels, grid};
}

Status TorchScriptTower::CheckResult(const c10::IValue& result, std::int64_t total_tokens) const {
  if (!result.isTuple() || result.toTupleRef().elements().size() != 2) {
    return Internal("TorchScript tower " + path_ +
                    ": forward must return Tuple[Tensor, Tensor] (main, deepstack), got " + result.type()->str());
  }
  const auto& elements = result.toTupleRef().elements();
  if (Status s = CheckOutput(elements[0], "main", total_tokens, meta_.hidden); !s.ok()) return s;
  return CheckOutput(elements[1], "deepstack", total_tokens, meta_.hidden * meta_.deepstack_layers);
}

void TorchScriptTower::StoreOutputs(const c10::IValue& result, TowerOutput& out) const {
  const auto& elements = result.toTupleRef().elements();
  const at::ScalarType dtype = ToScalarType(dtype_);
  if (!output_on_device_) {
    out.main = HostBytes(elements[0].toTensor(), dtype);
    out.deepstack = HostBytes(elements[1].toTensor(), dtype);
    return;
  }
  // Converted and made contiguous on the device; the synchronise makes
  // the rows complete before anyone copies them on another stream.
  auto owner = std::make_shared<DeviceOutputTensors>();
  owner->main = elements[0].toTensor().to(dtype).contiguous();
  owner->deepstack = elements[1].toTensor().to(dtype).contiguous();
  torch::cuda::synchronize(device_.index());
  out.device_main = static_cast<const std::byte*>(owner->main.data_ptr());
  out.device_deepstack =
      meta_.deepstack_layers > 0 ? static_cast<const std::byte*>(owner->deepstack.data_ptr()) : nullptr;
  out.device_owner = std::move(owner);
}

StatusOr<TowerOutput> TorchScriptTower::Encode(std::span<const TowerItem> items) {
  std::int64_t total_patches = 0;
  std::int64_t total_tokens = 0;
  if (Status s = ValidateTowerItems(items, meta_.patch_dim, meta_.merge_size, &total_patches, &total_tokens); !s.ok()) {
    return s;
  }
  TowerOutput out;
  out.tokens = total_tokens;
  out.hidden = meta_.hidden;
  out.deepstack_layers = meta_.deepstack_layers;
  out.dtype = dtype_;
  if (items.empty()) return out;
  try {
    c10::InferenceMode inference_mode;
    if (at::get_num_threads() != num_threads_) at::set_num_threads(num_threads_);
    auto [pixels, grid] = PackInputs(items, total_patches);
    c10::IValue result = module_.forward({pixels, grid});
    if (Status s = CheckResult(result, total_tokens); !s.ok()) return s;
    StoreOutputs(result, out);
  } catch (const std::exception& e) {
    return Internal("TorchScript tower " + path_ + ": forward failed: " + TorchMessage(e));
  }
  return out;
}

// The contract's attributes and forward's arity (docs/TOWER.md).
StatusOr<Metadata> ReadContract(torch::jit::Module& module, const std::string& path) {
  Metadata meta;
  if (Status s = ReadIntAttribute(module, path, "patch_dim", 1, &meta.patch_dim); !s.ok()) return s;
  if (Status s = ReadIntAttribute(module, path, "merge_size", 1, &meta.merge_size); !s.ok()) return s;
  if (Status s = ReadIntAttribute(module, path, "hidden_size", 1, &meta.hidden); !s.ok()) return s;
  if (Status s = ReadIntAttribute(module, path, "deepstack_layers", 0, &meta.deepstack_layers); !s.ok()) return s;
  if (Status s = ReadChunkAttribute(module, path, &meta.temporal_chunks_independent); !s.ok()) return s;
  auto forward = module.find_method("forward");
  if (!forward) return InvalidArgument("TorchScript tower " + path + " has no forward method");
  // The schema counts `self`.
  const auto& args = forward->function().getSchema().arguments();
  if (args.size() != 3) {
    return InvalidArgument("TorchScript tower " + path + ": forward must take (pixel_values, grid_thw), schema is " +
                           toString(forward->function().getSchema()));
  }
  return meta;
}

// Two forwards on one zero-valued merge block (TorchTowerOptions::warm_up).
Status WarmUp(VisionTower& tower, const Metadata& meta) {
  const GridTHW grid{1, meta.merge_size, meta.merge_size};
  const std::vector<float> zeros(static_cast<std::size_t>(grid.patches() * meta.patch_dim));
  const TowerItem item{zeros.data(), grid, meta.patch_dim};
  for (int i = 0; i < 2; ++i) {
    auto out = tower.Encode({&item, 1});
    if (!out.ok()) {
      return InvalidArgument("warm-up forward on one " + std::to_string(meta.merge_size) + "x" +
                             std::to_string(meta.merge_size) + " block failed: " + out.status().message());
    }
  }
  return Status::Ok();
}

// The options' checks that need no module: threads, path, device.
StatusOr<c10::Device> CheckLoadOptions(const TorchTowerOptions& options) {
  if (options.num_threads < 0) {
    return InvalidArgument("torch tower num_threads must be >= 0 (0 = all cores), got " +
                           std::to_string(options.num_threads));
  }
  if (options.model_path.empty()) return InvalidArgument("torch tower model_path is empty");
  std::error_code ec;
  if (!std::filesystem::is_regular_file(options.model_path, ec)) {
    return Status(StatusCode::kNotFound, "TorchScript tower file not found: " + options.model_path);
  }
  auto device = ParseDevice(options.device);
  if (!device.ok()) return device.status();
  if (options.output_on_device && device->is_cpu()) {
    return InvalidArgument("torch tower output_on_device needs a cuda device, got '" + options.device + "'");
  }
  return *device;
}

}  // namespace

StatusOr<std::unique_ptr<VisionTower>> LoadTorchScriptTower(const TorchTowerOptions& options) {
  const std::string& path = options.model_path;
  StatusOr<c10::Device> device = CheckLoadOptions(options);
  if (!device.ok()) return device.status();
  if (options.tune_malloc) TuneMallocOnce();
  int threads = options.num_threads;
  if (threads == 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  try {
    torch::jit::Module module;
    try {
      module = torch::jit::load(path, c10::Device(c10::kCPU));
    } catch (const std::exception& e) {
      return InvalidArgument("cannot load " + path + " as a TorchScript archive " +
                             "(torch.jit.save output expected): " + TorchMessage(e));
    }
    StatusOr<Metadata> meta = ReadContract(module, path);
    if (!meta.ok()) return meta.status();
    module.eval();
    if (!device->is_cpu()) module.to(*device);
    at::set_num_threads(threads);
    auto tower = std::make_unique<TorchScriptTower>(std::move(module), *meta, *device, threads, options.output_dtype,
                                                    options.output_on_device, path);
    if (options.warm_up) {
      if (Status s = WarmUp(*tower, *meta); !s.ok()) return s;
    }
    return std::unique_ptr<VisionTower>(std::move(tower));
  } catch (const std::exception& e) {
    return InvalidArgument("TorchScript tower " + path + ": " + TorchMessage(e));
  }
}

}  // namespace epd
