// Contract tests of the TorchScript backend with tiny hand-written modules.
//
// Each module is defined in TorchScript source through libtorch (so this is
// the one test unit that includes torch), saved to a temporary archive and
// loaded through the public LoadTorchScriptTower. A "known-answer" module
// makes the output a simple function of the packed input, so the tests can
// compute the expected bytes by hand; the broken modules each violate one
// clause of the contract in docs/TOWER.md.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/script.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "epd/torch_tower/torch_tower.h"

namespace epd {
namespace {

constexpr std::int64_t kPatchDim = 12;
constexpr std::int64_t kHidden = 8;

struct Attrs {
  std::int64_t patch_dim = kPatchDim;
  std::int64_t merge_size = 2;
  std::int64_t hidden_size = kHidden;
  std::int64_t deepstack_layers = 1;
};

// Saves a module with `attrs` and `forward_src` to a temporary file.
// `skip` names one attribute to leave out; `tweak` may add others.
class TempTower {
 public:
  explicit TempTower(const std::string& forward_src, const Attrs& attrs = {}, const std::string& skip = "",
                     const std::function<void(torch::jit::Module&)>& tweak = nullptr) {
    static std::atomic<int> counter{0};
    path_ = (std::filesystem::temp_directory_path() /
             ("epd_contract_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + ".pt"))
                .string();
    torch::jit::Module m("__torch__.ContractTower");
    const std::pair<const char*, std::int64_t> ints[] = {{"patch_dim", attrs.patch_dim},
                                                         {"merge_size", attrs.merge_size},
                                                         {"hidden_size", attrs.hidden_size},
                                                         {"deepstack_layers", attrs.deepstack_layers}};
    for (const auto& [name, value] : ints) {
      if (skip != name) m.register_attribute(name, c10::IntType::get(), value);
    }
    if (tweak) tweak(m);
    m.define(forward_src);
    m.save(path_);
  }
  ~TempTower() { std::filesystem::remove(path_); }
  const std::string& path() const { return path_; }

  StatusOr<std::unique_ptr<VisionTower>> Load(DType dtype = DType::kFloat32) const {
    TorchTowerOptions opts;
    opts.model_path = path_;
    opts.num_threads = 1;
    opts.output_dtype = dtype;
    // Off so that contract violations surface in Encode, where these tests
    // look for them; WarmUpRejectsABrokenTowerAtLoad covers the warm-up.
    opts.warm_up = false;
    return LoadTorchScriptTower(opts);
  }

 private:
  std::string path_;
};

// main: the first 8 floats of each token's first patch row (rows 4j);
// deepstack: the item's (t, h, w) as floats, then that row's floats 0..4.
constexpr char kKnownAnswer[] = R"(
def forward(self, pixel_values: Tensor, grid_thw: Tensor) -> Tuple[Tensor, Tensor]:
    m2 = self.merge_size * self.merge_size
    folded = pixel_values.reshape(-1, m2 * self.patch_dim)
    counts = grid_thw.prod(1) // m2
    grids = grid_thw.float().repeat_interleave(counts, dim=0)
    deep = torch.cat([grids, folded[:, 0:5]], dim=1)
    return folded[:, 0:self.hidden_size], deep
)";

// Item rows with value = item * 1000 + row * 16 + col: exact in float32,
// float16 (< 2048 needs item 0 or 1 and few rows) and bfloat16 (checked below).
std::vector<float> Rows(std::int64_t rows, int item) {
  std::vector<float> v(rows * kPatchDim);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < kPatchDim; ++c)
      v[r * kPatchDim + c] = static_cast<float>(std::int64_t{item} * 1000 + r * 16 + c);
  }
  return v;
}

std::vector<float> Floats(const std::vector<std::byte>& b) {
  std::vector<float> f(b.size() / 4);
  std::memcpy(f.data(), b.data(), b.size());
  return f;
}

// Whether `s` failed with `code` and a message containing `part`.
::testing::AssertionResult FailedWith(const Status& s, StatusCode code, const std::string& part) {
  if (s.code() == code && s.message().find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "expected " << StatusCodeName(code) << " containing \"" << part << "\", got "
                                       << s.ToString();
}

// Loads `module` and encodes one item of grid `g` (rows of item 0). A load
// failure comes back as is: no Encode error these tests look for has a load
// error's code.
Status EncodeOne(const TempTower& module, GridTHW g = {1, 2, 2}) {
  auto tower = module.Load();
  if (!tower.ok()) return tower.status();
  const auto r = Rows(g.patches(), 0);
  return (*tower)->Encode(std::vector<TowerItem>{{r.data(), g, 0}}).status();
}

TEST(TorchTowerContract, PacksItemsInBatchOrderAndPassesTheirGrids) {
  TempTower module(kKnownAnswer);
  auto tower = module.Load();
  ASSERT_TRUE(tower.ok()) << tower.status().ToString();
  const GridTHW a{1, 2, 4}, b{2, 2, 2};  // 2 and 2 tokens
  const auto ra = Rows(a.patches(), 0), rb = Rows(b.patches(), 1);
  auto out = (*tower)->Encode(std::vector<TowerItem>{{ra.data(), a, 0}, {rb.data(), b, 0}});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ASSERT_EQ(out->tokens, 4);
  const auto main = Floats(out->main);
  const auto deep = Floats(out->deepstack);
  ASSERT_EQ(main.size(), 4u * kHidden);
  ASSERT_EQ(deep.size(), 4u * kHidden);
  // Token j of an item starts at its patch row 4j.
  const float first_row[4] = {0, 4 * 16, 1000, 1000 + 4 * 16};
  const float grid_of[4][3] = {{1, 2, 4}, {1, 2, 4}, {2, 2, 2}, {2, 2, 2}};
  for (int tok = 0; tok < 4; ++tok) {
    for (int c = 0; c < kHidden; ++c) {
      EXPECT_EQ(main[tok * kHidden + c], first_row[tok] + c) << "token " << tok << " col " << c;
    }
    for (int c = 0; c < 3; ++c) EXPECT_EQ(deep[tok * kHidden + c], grid_of[tok][c]);
    for (int c = 0; c < 5; ++c) EXPECT_EQ(deep[tok * kHidden + 3 + c], first_row[tok] + c);
  }
}

TEST(TorchTowerContract, Float16OutputHoldsTheSameValues) {
  TempTower module(kKnownAnswer);
  auto tower = module.Load(DType::kFloat16);
  ASSERT_TRUE(tower.ok()) << tower.status().ToString();
  const GridTHW g{1, 2, 2};
  const auto r = Rows(g.patches(), 1);
  auto out = (*tower)->Encode(std::vector<TowerItem>{{r.data(), g, 0}});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->dtype, DType::kFloat16);
  ASSERT_EQ(out->main.size(), kHidden * 2u);
  // 1000 + c for c < 8 in IEEE binary16: exponent 9 (512..1024) has a
  // spacing of 0.5, so all are exact: sign 0, biased exponent 24,
  // mantissa (1000 + c - 512) * 2.
  std::vector<std::uint16_t> h(kHidden);
  std::memcpy(h.data(), out->main.data(), out->main.size());
  for (int c = 0; c < kHidden; ++c) {
    EXPECT_EQ(h[c], (24u << 10) | static_cast<std::uint16_t>((1000 + c - 512) * 2)) << c;
  }
}

TEST(TorchTowerContract, Float64OutputIsConvertedToFloat32) {
  TempTower module(R"(
def forward(self, pixel_values: Tensor, grid_thw: Tensor) -> Tuple[Tensor, Tensor]:
    n = pixel_values.size(0) // 4
    main = torch.full([n, self.hidden_size], 0.25).double()
    return main, torch.full([n, self.hidden_size], -3.0).double()
)");
  auto tower = module.Load();
  ASSERT_TRUE(tower.ok()) << tower.status().ToString();
  const GridTHW g{1, 2, 2};
  const auto r = Rows(g.patches(), 0);
  auto out = (*tower)->Encode(std::vector<TowerItem>{{r.data(), g, 0}});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(Floats(out->main), std::vector<float>(kHidden, 0.25f));
  EXPECT_EQ(Floats(out->deepstack), std::vector<float>(kHidden, -3.0f));
}

TEST(TorchTowerContract, WrongMainShapeIsInternalNamingExpectedAndGot) {
  TempTower module(R"(
def forward(self, pixel_values: Tensor, grid_thw: Tensor) -> Tuple[Tensor, Tensor]:
    n = pixel_values.size(0) // 4 + 1
    return torch.zeros([n, self.hidden_size]), torch.zeros([n, self.hidden_size])
)");
  EXPECT_TRUE(FailedWith(EncodeOne(module, GridTHW{1, 2, 4}), StatusCode::kInternal,
                         "main output has shape [3, 8], expected [2, 8]"));
}

TEST(TorchTowerContract, WarmUpRejectsABrokenTowerAtLoad) {
  TempTower module(R"(
def forward(self, pixel_values: Tensor, grid_thw: Tensor) -> Tuple[Tensor, Tensor]:
    n = pixel_values.size(0) // 4 + 1
    return torch.zeros([n, self.hidden_size]), torch.zeros([n, self.hidden_size])
)");
  TorchTowerOptions opts;
  opts.model_path = module.path();
  opts.num_threads = 1;
  auto tower = LoadTorchScriptTower(opts);
  ASSERT_FALSE(tower.ok());
  EXPECT_EQ(tower.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(tower.status().message().find("warm-up forward on one 2x2 block failed: TorchScript tower " +
                                          module.path() + ": forward's main output has shape [2, 8], expected [1, 8]"),
            std::string::npos)
      << tower.status().message();
}

TEST(TorchTowerContract, WrongDeepstackWidthIsInternal) {
  TempTower module(R"(
def forward(self, pixel_values: Tensor, grid_thw: Tensor) -> Tuple[Tensor, Tensor]:
    n = pixel_values.size(0) // 4
    return torch.zeros([n, self.hidden_size]), torch.zeros([n, 3 * self.hidden_size])
)",
                   Attrs{.deepstack_layers = 2});
  EXPECT_TRUE(
      FailedWith(EncodeOne(module), StatusCode::kInternal, "deepstack output has shape [1, 24], expected [1, 16]"));
}

TEST(TorchTowerContract, NonTupleResultIsInternal) {
  TempTower module(R"(
def forward(self, pixel_values: Tensor, grid_thw: Tensor) -> Tensor:
    return torch.zeros([pixel_values.size(0) // 4, self.hidden_size])
)");
  EXPECT_TRUE(FailedWith(EncodeOne(module), StatusCode::kInternal, "Tuple[Tensor, Tensor]"));
}

TEST(TorchTowerContract, IntegerOutputIsInternal) {
  TempTower module(R"(
def forward(self, pixel_values: Tensor, grid_thw: Tensor) -> Tuple[Tensor, Tensor]:
    n = pixel_values.size(0) // 4
    z = torch.zeros([n, self.hidden_size]).long()
    return z, z
)");
  EXPECT_TRUE(FailedWith(EncodeOne(module), StatusCode::kInternal, "dtype Long"));
}

TEST(TorchTowerContract, ExceptionInForwardIsInternalWithItsMessage) {
  TempTower module(R"(
def forward(self, pixel_values: Tensor, grid_thw: Tensor) -> Tuple[Tensor, Tensor]:
    assert grid_thw.size(0) == 1, "tower refuses batches"
    n = pixel_values.size(0) // 4
    return torch.zeros([n, self.hidden_size]), torch.zeros([n, self.hidden_size])
)");
  auto tower = module.Load();
  ASSERT_TRUE(tower.ok()) << tower.status().ToString();
  const GridTHW g{1, 2, 2};
  const auto r = Rows(g.patches(), 0);
  auto out = (*tower)->Encode(std::vector<TowerItem>{{r.data(), g, 0}, {r.data(), g, 0}});
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kInternal);
  EXPECT_NE(out.status().message().find("tower refuses batches"), std::string::npos) << out.status().message();
  // The tower stays usable after a failed forward.
  EXPECT_TRUE((*tower)->Encode(std::vector<TowerItem>{{r.data(), g, 0}}).ok());
}

TEST(TorchTowerContract, MissingAttributeIsInvalidAndNamed) {
  TempTower module(R"(
def forward(self, pixel_values: Tensor, grid_thw: Tensor) -> Tuple[Tensor, Tensor]:
    return pixel_values, pixel_values
)",
                   Attrs{}, "hidden_size");
  EXPECT_TRUE(FailedWith(module.Load().status(), StatusCode::kInvalidArgument, "no attribute 'hidden_size'"));
}

TEST(TorchTowerContract, NonIntAttributeIsInvalid) {
  TempTower module(R"(
def forward(self, pixel_values: Tensor, grid_thw: Tensor) -> Tuple[Tensor, Tensor]:
    return pixel_values, pixel_values
)",
                   Attrs{}, "merge_size",
                   [](torch::jit::Module& m) { m.register_attribute("merge_size", c10::FloatType::get(), 2.0); });
  EXPECT_TRUE(FailedWith(module.Load().status(), StatusCode::kInvalidArgument, "'merge_size' must be an int"));
}

TEST(TorchTowerContract, OutOfRangeAttributeIsInvalid) {
  TempTower module(kKnownAnswer, Attrs{.deepstack_layers = -1});
  EXPECT_TRUE(
      FailedWith(module.Load().status(), StatusCode::kInvalidArgument, "'deepstack_layers' = -1, must be >= 0"));
}

TEST(TorchTowerContract, ForwardWithWrongArityIsInvalid) {
  TempTower module(R"(
def forward(self, pixel_values: Tensor) -> Tuple[Tensor, Tensor]:
    return pixel_values, pixel_values
)");
  EXPECT_TRUE(
      FailedWith(module.Load().status(), StatusCode::kInvalidArgument, "forward must take (pixel_values, grid_thw)"));
}

TEST(TorchTowerContract, MissingForwardIsInvalid) {
  TempTower module(R"(
def encode(self, pixel_values: Tensor, grid_thw: Tensor) -> Tensor:
    return pixel_values
)");
  EXPECT_TRUE(FailedWith(module.Load().status(), StatusCode::kInvalidArgument, "no forward method"));
}

// OpenMP keeps the intra-op thread count per thread, so the count must hold
// on the thread that loads and on any thread that later calls Encode.
TEST(TorchTowerContract, ThreadCountAppliesOnLoadingAndEncodingThreads) {
  TempTower module(kKnownAnswer);
  TorchTowerOptions opts;
  opts.model_path = module.path();
  opts.num_threads = 3;
  opts.warm_up = false;
  auto tower = LoadTorchScriptTower(opts);
  ASSERT_TRUE(tower.ok()) << tower.status().ToString();
  EXPECT_EQ(at::get_num_threads(), 3);
  EXPECT_NE((*tower)->Describe().find("(cpu, 3 threads,"), std::string::npos) << (*tower)->Describe();
  int seen_before = 0, seen_after = 0;
  std::thread worker([&] {
    at::set_num_threads(1);
    seen_before = at::get_num_threads();
    const GridTHW g{1, 2, 2};
    const auto r = Rows(g.patches(), 0);
    EXPECT_TRUE((*tower)->Encode(std::vector<TowerItem>{{r.data(), g, 0}}).ok());
    seen_after = at::get_num_threads();
  });
  worker.join();
  EXPECT_EQ(seen_before, 1);
  EXPECT_EQ(seen_after, 3);
}

TEST(TorchTowerContract, CudaDeviceWithoutCudaIsFailedPrecondition) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "a CUDA device is available";
  TempTower module(kKnownAnswer);
  TorchTowerOptions opts;
  opts.model_path = module.path();
  opts.device = "cuda:0";
  auto tower = LoadTorchScriptTower(opts);
  ASSERT_FALSE(tower.ok());
  EXPECT_EQ(tower.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(tower.status().message().find("CUDA is not available"), std::string::npos) << tower.status().message();
}

}  // namespace
}  // namespace epd
