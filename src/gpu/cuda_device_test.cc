// The tier contract on a real CUDA device, and OpenCudaDevice's errors.
// Every test that needs a device skips itself (GTEST_SKIP, naming the CUDA
// error) where none is present, so the binary passes on a CPU-only machine.
#include "epd/gpu_cuda/cuda_device.h"

#include <gtest/gtest.h>

#include "device_tier_contract.h"

namespace epd {
namespace {

std::unique_ptr<Device> OpenCuda(std::size_t device_bytes, std::size_t pinned_bytes, std::string* why) {
  StatusOr<int> count = CudaDeviceCount();
  if (!count.ok()) {
    *why = count.status().ToString();
    return nullptr;
  }
  if (*count == 0) {
    *why = "no CUDA device present";
    return nullptr;
  }
  CudaDeviceOptions opt;
  opt.pinned_pool_bytes = pinned_bytes;
  opt.device_bytes_limit = device_bytes;
  StatusOr<std::unique_ptr<Device>> dev = OpenCudaDevice(opt);
  if (!dev.ok()) {
    // A device is present but cannot be opened: that is a failure, not a skip.
    ADD_FAILURE() << "OpenCudaDevice: " << dev.status().ToString();
    *why = dev.status().ToString();
    return nullptr;
  }
  return std::move(dev).value();
}

INSTANTIATE_TEST_SUITE_P(Cuda, DeviceTierContract, ::testing::Values(DeviceFactory{"Cuda", OpenCuda}),
                         DeviceFactoryName);

bool HaveDevice() {
  StatusOr<int> n = CudaDeviceCount();
  return n.ok() && *n > 0;
}

TEST(CudaDeviceTest, OpenWithoutADeviceIsFailedPrecondition) {
  if (HaveDevice()) GTEST_SKIP() << "a CUDA device is present; this checks the no-device path";
  StatusOr<std::unique_ptr<Device>> dev = OpenCudaDevice({});
  ASSERT_FALSE(dev.ok());
  EXPECT_EQ(dev.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(dev.status().message().find("no usable CUDA device"), std::string::npos) << dev.status().message();
}

TEST(CudaDeviceTest, DeviceIndexOutOfRangeIsFailedPrecondition) {
  StatusOr<int> n = CudaDeviceCount();
  if (!n.ok() || *n == 0) GTEST_SKIP() << "no CUDA device: " << n.status().ToString();
  CudaDeviceOptions opt;
  opt.device_index = *n;
  StatusOr<std::unique_ptr<Device>> dev = OpenCudaDevice(opt);
  EXPECT_EQ(dev.status().code(), StatusCode::kFailedPrecondition);
}

TEST(CudaDeviceTest, DescribeNamesTheCardAndThePool) {
  StatusOr<int> n = CudaDeviceCount();
  if (!n.ok() || *n == 0) GTEST_SKIP() << "no CUDA device: " << n.status().ToString();
  CudaDeviceOptions opt;
  opt.pinned_pool_bytes = std::size_t{8} << 20;
  StatusOr<std::unique_ptr<Device>> dev = OpenCudaDevice(opt);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  const std::string d = (*dev)->Describe();
  EXPECT_EQ(d.rfind("cuda:0 (", 0), 0u) << d;
  EXPECT_NE(d.find("pinned pool 8 MiB"), std::string::npos) << d;
  EXPECT_EQ((*dev)->memory_stats().pinned_capacity_bytes, std::size_t{8} << 20);
}

// A large entry (a 1300-token, 3584-wide bf16 embedding with 3 deepstack
// layers, ~37 MB: a Qwen2-VL-7B-sized photo) survives offload and onboard.
TEST(CudaDeviceTest, LargeEntryRoundTripsByteExact) {
  StatusOr<int> n = CudaDeviceCount();
  if (!n.ok() || *n == 0) GTEST_SKIP() << "no CUDA device: " << n.status().ToString();
  CudaDeviceOptions opt;
  opt.pinned_pool_bytes = std::size_t{64} << 20;
  StatusOr<std::unique_ptr<Device>> dev = OpenCudaDevice(opt);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  const EmbeddingPtr emb = testing_util::MakeEmbedding(77, 1300, 3584, 3, DType::kBFloat16);
  StatusOr<TierEmbeddingPtr> l1 = UploadEmbedding(**dev, emb);
  ASSERT_TRUE(l1.ok()) << l1.status().ToString();
  StatusOr<TierEmbeddingPtr> l2 = OffloadEmbedding(**dev, *l1);
  ASSERT_TRUE(l2.ok()) << l2.status().ToString();
  l1 = TierEmbeddingPtr();
  StatusOr<TierEmbeddingPtr> back = OnboardEmbedding(**dev, *l2);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  l2 = TierEmbeddingPtr();
  StatusOr<Embedding> host = (*back)->ToHostEmbedding();
  ASSERT_TRUE(host.ok()) << host.status().ToString();
  EXPECT_TRUE(testing_util::SameAsSeed(*host, 77));
}

}  // namespace
}  // namespace epd
