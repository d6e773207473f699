"""The libtorch Qwen-VL towers against an independent reference, on real photos.

For each architecture (Qwen2-VL, Qwen2.5-VL, Qwen3-VL), the tiny random
checkpoints the build writes (scripts/make_tiny_checkpoint.py ->
build/models/tiny-<arch>) are run through

  * the C++ tool `checkpoint_tower_dump --model DIR --in IN --out OUT`
    (IN: pixel_values F32 [N, patch_dim], grid_thw I64 [n, 3]; OUT: main F32
    [T, out_hidden] and, with deepstack, deepstack F32 [T, out_hidden * L]);
  * qwen_vl_reference.py, an eager PyTorch re-implementation from the
    architecture description, in float64;

on photographs from scikit-image's data directory (Debian python3-skimage),
preprocessed here as each model's Hugging Face processor does (smart_resize
with the checkpoint's patch * merge factor, PIL bicubic, rescale, normalise,
patchify). Agreement is measured per output tensor as

    rel = max |tool - reference| / max |reference|      (must be <= 1e-4)

Environment: EPD_BUILD_DIR (default <repo>/build) locates the tool
(src/tower/checkpoint_tower_dump, or $EPD_CHECKPOINT_TOWER_DUMP) and the
checkpoints (models/tiny-<arch>, or $EPD_TINY_CHECKPOINTS/tiny-<arch>).
The tests that need the tool are skipped only when EPD_WITH_TORCH=OFF (or
that build's CMakeCache.txt says so), or when EPD_CHECKPOINT_TOWER_DUMP is set
but empty (CTest's way of saying the build defines no such target); otherwise
a missing tool or checkpoint is a failure. The reference-only checks at the
top need no build. CTest runs this file as checkpoint_tower_tests
(src/tower/tiny_checkpoints.cmake).
"""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
import qwen_vl_reference as ref  # noqa: E402

PHOTOS = pathlib.Path(os.environ.get("EPD_PHOTO_DIR", "/usr/lib/python3/dist-packages/skimage/data"))
TOLERANCE = 1e-4


def photo(name):
    path = PHOTOS / name
    if not path.is_file():
        pytest.fail(f"photo {path} not found: install python3-skimage (scripts/install-deps.sh)")
    return Image.open(path).convert("RGB")


def build_dir():
    return pathlib.Path(os.environ.get("EPD_BUILD_DIR", REPO / "build"))


def torch_tower_built():
    """False only when the environment or the build's cache says EPD_WITH_TORCH is off."""
    flag = os.environ.get("EPD_WITH_TORCH")
    if flag is not None:
        return flag.upper() not in ("0", "OFF", "FALSE", "NO")
    cache = build_dir() / "CMakeCache.txt"
    if cache.is_file():
        for line in cache.read_text(errors="replace").splitlines():
            if line.startswith("EPD_WITH_TORCH:"):
                return line.split("=", 1)[1].strip().upper() not in ("0", "OFF", "FALSE", "NO")
    return cache.is_file()


def require_tool():
    """The C++ tool's path; skips when this build has no torch towers, fails when it should have the tool."""
    if not torch_tower_built():
        pytest.skip("EPD_WITH_TORCH is OFF in this build: no libtorch checkpoint towers")
    configured = os.environ.get("EPD_CHECKPOINT_TOWER_DUMP")
    if configured == "":
        # CTest sets it empty when the build defines no checkpoint_tower_dump target.
        pytest.skip("this build defines no checkpoint_tower_dump target (EPD_CHECKPOINT_TOWER_DUMP is empty)")
    exe = pathlib.Path(configured or build_dir() / "src" / "tower" / "checkpoint_tower_dump")
    if not os.access(exe, os.X_OK):
        pytest.fail(f"{exe} is not built; it is the C++ checkpoint tower this test checks "
                    "(target checkpoint_tower_dump, or set EPD_CHECKPOINT_TOWER_DUMP)")
    return exe


def tiny_checkpoint(arch):
    require_tool()
    base = pathlib.Path(os.environ.get("EPD_TINY_CHECKPOINTS", build_dir() / "models"))
    path = base / f"tiny-{arch}"
    if not (path / "config.json").is_file():
        pytest.fail(f"tiny checkpoint {path} is missing; the build writes it (target tiny_checkpoints)")
    return path


def _load_script():
    spec = importlib.util.spec_from_file_location("make_tiny_checkpoint", REPO / "scripts" / "make_tiny_checkpoint.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def relative_error(got, want):
    got, want = torch.as_tensor(got).double(), torch.as_tensor(want).double()
    assert got.shape == want.shape, f"shape {tuple(got.shape)} != reference {tuple(want.shape)}"
    return ((got - want).abs().max() / want.abs().max()).item()


def assert_close(got, want, what):
    err = relative_error(got, want)
    assert err <= TOLERANCE, f"{what}: max|tool - reference| / max|reference| = {err:.3g} > {TOLERANCE}"


class Tower:
    """A checkpoint directory with its reference model and preprocessing."""

    _cache = {}

    def __init__(self, model_dir):
        self.dir = pathlib.Path(model_dir)
        self.model, self.arch, self.config, self.pre = ref.load_tower(self.dir)

    @classmethod
    def get(cls, model_dir):
        key = str(model_dir)
        if key not in cls._cache:
            cls._cache[key] = cls(model_dir)
        return cls._cache[key]

    def reference(self, items):
        """items: [(pixel_values, (t, h, w))] -> (main, deepstack) of the batch."""
        pv = torch.cat([torch.from_numpy(p) for p, _ in items])
        return ref.run(self.model, pv, [g for _, g in items])

    def tool(self, items, tmp_path, threads=2):
        """Runs checkpoint_tower_dump on the batch; returns (main, deepstack or None)."""
        exe = require_tool()
        inp, out = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
        ref.write_safetensors(inp, {
            "pixel_values": np.concatenate([p for p, _ in items]).astype(np.float32),
            "grid_thw": np.array([g for _, g in items], dtype=np.int64),
        })
        proc = subprocess.run([str(exe), "--model", str(self.dir), "--in", str(inp), "--out", str(out),
                               "--threads", str(threads)], capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"{exe.name} exited {proc.returncode}: {proc.stderr.strip()}"
        tensors = ref.read_safetensors(out)
        has_deepstack = self.model.deepstack_layers > 0
        assert set(tensors) == ({"main", "deepstack"} if has_deepstack else {"main"}), sorted(tensors)
        return tensors["main"], tensors.get("deepstack")

    def compare(self, items, tmp_path, what):
        got_main, got_ds = self.tool(items, tmp_path)
        want_main, want_ds = self.reference(items)
        assert got_main.dtype == torch.float32
        assert_close(got_main, want_main, f"{what}: main")
        if want_ds is not None:
            assert got_ds.dtype == torch.float32
            assert_close(got_ds, want_ds, f"{what}: deepstack")
        return got_main, got_ds


def tokens(grid, merge):
    t, h, w = grid
    return t * h * w // (merge * merge)


# ---------------------------------------------------------------------------
# The reference and the preprocessing on their own (no build needed).


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    """Checkpoints written by the generator script itself, for the reference-only checks."""
    script = _load_script()
    out = {}
    for arch in ref.ARCHS:
        d = tmp_path_factory.mktemp(f"gen-{arch}")
        script.build(arch, str(d))
        out[arch] = d
    return out


@pytest.mark.parametrize("arch,tokens_640x427", [("qwen2_vl", 345), ("qwen2_5_vl", 345), ("qwen3_vl", 260)])
def test_preprocessing_token_count_of_a_640x427_photo(tiny_dirs, arch, tokens_640x427):
    # Token counts from the issue: factor 28 (Qwen2 family) and 32 (Qwen3-VL).
    pre = Tower.get(tiny_dirs[arch]).pre
    h, w = pre.smart_resize(427, 640)
    assert (h // pre.factor) * (w // pre.factor) == tokens_640x427


def test_preprocessing_reads_qwen3_size_fields(tiny_dirs):
    pre = Tower.get(tiny_dirs["qwen3_vl"]).pre
    assert (pre.patch_size, pre.factor, pre.min_pixels, pre.max_pixels) == (16, 32, 65536, 16777216)
    assert list(pre.mean) == [0.5, 0.5, 0.5] and list(pre.std) == [0.5, 0.5, 0.5]


def test_patchify_matches_the_conv3d_input_layout(tiny_dirs):
    # Patch k's row, viewed as [C, T, p, p], is the image's pixels at that patch.
    pre = Tower.get(tiny_dirs["qwen2_vl"]).pre
    frames = pre.frames_to_array([photo("chelsea.png")])
    pv, (t, gh, gw) = pre.patchify(frames)
    p, m = pre.patch_size, pre.merge_size
    assert pv.shape == (gh * gw, 3 * 2 * p * p) and t == 1
    # Token 5 is block (0, 1), row 0, col 1 in its block: patch row 0, patch col 3.
    patch = pv[5].reshape(3, 2, p, p)
    np.testing.assert_allclose(patch[:, 0], frames[0, :, 0:p, 3 * p:4 * p], rtol=1e-6)
    np.testing.assert_allclose(patch[:, 1], patch[:, 0])  # an image fills both temporal slots
    assert m == 2


@pytest.mark.parametrize("arch", ref.ARCHS)
def test_reference_batch_equals_each_alone(tiny_dirs, arch):
    tower = Tower.get(tiny_dirs[arch])
    items = [tower.pre.image(photo("chelsea.png")), tower.pre.image(photo("coffee.png"), size=(4 * tower.pre.factor, 3 * tower.pre.factor))]
    main, ds = tower.reference(items)
    row = 0
    for item in items:
        alone_main, alone_ds = tower.reference([item])
        n = tokens(item[1], tower.pre.merge_size)
        assert relative_error(main[row:row + n], alone_main) < 1e-12
        if ds is not None:
            assert relative_error(ds[row:row + n], alone_ds) < 1e-12
        row += n
    assert row == main.shape[0]
    assert main.shape[1] == tower.model.out_dim
    if arch == "qwen3_vl":
        assert ds.shape == (main.shape[0], tower.model.out_dim * len(tower.config["vision_config"]["deepstack_visual_indexes"]))
    else:
        assert ds is None


@pytest.mark.parametrize("arch", ref.ARCHS)
def test_reference_video_frames_are_independent(tiny_dirs, arch):
    # Attention is per temporal patch and positions depend only on (row, col),
    # so frames [A, A, B, B] (t = 2) encode as image A followed by image B.
    tower = Tower.get(tiny_dirs[arch])
    size = (4 * tower.pre.factor, 5 * tower.pre.factor)
    a, b = photo("astronaut.png"), photo("coffee.png")
    video = tower.pre.video([a, a, b, b], size=size)
    assert video[1][0] == 2
    main, ds = tower.reference([video])
    ma, da = tower.reference([tower.pre.image(a, size=size)])
    mb, db = tower.reference([tower.pre.image(b, size=size)])
    assert relative_error(main, torch.cat([ma, mb])) < 1e-12
    if ds is not None:
        assert relative_error(ds, torch.cat([da, db])) < 1e-12
    assert relative_error(ma, mb) > 1e-2  # the two frames really differ


def test_reference_window_permutation_and_its_inverse(tiny_dirs):
    tower = Tower.get(tiny_dirs["qwen2_5_vl"])
    model = tower.model
    # grid 22 x 32 (chelsea, 451x300 -> 448x308): 22 is not a multiple of the 8-patch window.
    items = [tower.pre.image(photo("chelsea.png")), tower.pre.image(photo("astronaut.png"))]
    assert items[0][1][1] % 8 != 0
    grid = torch.tensor([g for _, g in items])
    coords = model.token_coords(grid)
    order = model.window_order(coords)
    assert not torch.equal(order, torch.arange(order.numel()))
    assert torch.equal(order[torch.argsort(order)], torch.arange(order.numel()))
    # Whole post-merge units move together.
    units = order.reshape(-1, 4)
    assert torch.equal(units - units[:, :1], torch.arange(4).expand_as(units))
    # Windows hold at most 8 x 8 patches; the cut-off ones at the edges fewer.
    sizes = sorted(len(s) for s in model.window_segments(coords))
    assert sizes[-1] == 64 and sizes[0] < 64 and sum(sizes) == coords.shape[0]
    gathered, _ = tower.reference(items)
    pv = torch.cat([torch.from_numpy(p) for p, _ in items])
    permuted, _ = ref.run(model, pv, grid, window_mode="permute")
    assert relative_error(permuted, gathered) < 1e-12


def test_reference_window_attention_is_not_full_attention(tiny_dirs):
    # Guards the window test above from passing vacuously: with every block
    # switched to full attention the output must change.
    tower = Tower.get(tiny_dirs["qwen2_5_vl"])
    item = tower.pre.image(photo("astronaut.png"))
    windowed, _ = tower.reference([item])
    saved = tower.model.fullatt
    try:
        tower.model.fullatt = set(range(len(tower.model.blocks)))
        full, _ = tower.reference([item])
    finally:
        tower.model.fullatt = saved
    assert relative_error(full, windowed) > 1e-3


def test_qwen3_position_table_is_interpolated(tiny_dirs):
    tower = Tower.get(tiny_dirs["qwen3_vl"])
    side = tower.model.pos_side
    assert side * side == tower.config["vision_config"]["num_position_embeddings"]
    grid = torch.tensor([[1, 12, 20]])
    assert grid[0, 1] > side and grid[0, 2] > side
    pe = tower.model.position_embedding(grid, tower.model.token_coords(grid))
    table = tower.model.pos_embed.weight.reshape(side, side, -1)
    # Corners land exactly on the table's corners (align_corners); token 0 is (0, 0).
    assert torch.allclose(pe[0], table[0, 0])
    last = tower.model.token_coords(grid)[:, 2:].tolist().index([11, 19])
    assert torch.allclose(pe[last], table[-1, -1])


def test_loader_reads_only_vision_tensors_under_either_prefix(tiny_dirs):
    for arch in ref.ARCHS:
        _, _, _, state = ref.load_checkpoint(tiny_dirs[arch])
        assert "patch_embed.proj.weight" in state
        assert not any("embed_tokens" in k or "lm_head" in k for k in state)


# ---------------------------------------------------------------------------
# The C++ tower against the reference.


@pytest.mark.parametrize("arch", ref.ARCHS)
@pytest.mark.parametrize("name", ["astronaut.png", "coffee.png", "chelsea.png"])
def test_tower_matches_reference_on_a_photo(arch, name, tmp_path):
    tower = Tower.get(tiny_checkpoint(arch))
    item = tower.pre.image(photo(name))
    main, _ = tower.compare([item], tmp_path, f"{arch} {name} grid {item[1]}")
    assert main.shape[0] == tokens(item[1], tower.pre.merge_size)


@pytest.mark.parametrize("arch", ref.ARCHS)
def test_tower_batch_of_three_equals_each_alone(arch, tmp_path):
    tower = Tower.get(tiny_checkpoint(arch))
    items = [tower.pre.image(photo(n)) for n in ("chelsea.png", "coffee.png", "astronaut.png")]
    main, ds = tower.compare(items, tmp_path, f"{arch} batch of 3")
    row = 0
    for i, item in enumerate(items):
        (tmp_path / str(i)).mkdir()
        alone_main, alone_ds = tower.tool([item], tmp_path / str(i))
        n = tokens(item[1], tower.pre.merge_size)
        assert_close(main[row:row + n], alone_main, f"{arch} item {i} in a batch vs alone: main")
        if ds is not None:
            assert_close(ds[row:row + n], alone_ds, f"{arch} item {i} in a batch vs alone: deepstack")
        row += n


@pytest.mark.parametrize("grid_hw", [(20, 26), (22, 32), (8, 8), (2, 2)])
def test_qwen2_5_window_attention_on_grids_that_are_not_window_multiples(grid_hw, tmp_path):
    # 8 patches = 112 px windows; 20 x 26 and 22 x 32 leave cut-off windows at the
    # edges, 8 x 8 is exactly one window, 2 x 2 is smaller than a window.
    tower = Tower.get(tiny_checkpoint("qwen2_5_vl"))
    p = tower.pre.patch_size
    item = tower.pre.image(photo("astronaut.png"), size=(grid_hw[0] * p, grid_hw[1] * p))
    assert item[1] == (1, *grid_hw)
    tower.compare([item], tmp_path, f"qwen2_5_vl grid {item[1]}")


@pytest.mark.parametrize("arch", ref.ARCHS)
def test_tower_video_grid_with_two_temporal_patches(arch, tmp_path):
    tower = Tower.get(tiny_checkpoint(arch))
    f = tower.pre.factor
    frames = [photo("astronaut.png"), photo("coffee.png"), photo("chelsea.png"), photo("astronaut.png")]
    video = tower.pre.video(frames, size=(6 * f, 9 * f))
    assert video[1][0] == 2
    image = tower.pre.image(photo("coffee.png"))
    tower.compare([video, image], tmp_path, f"{arch} video t=2 + image")


@pytest.mark.parametrize("arch,dtype,shards", [("qwen2_vl", "f16", 1), ("qwen2_5_vl", "bf16", 3), ("qwen3_vl", "bf16", 4)])
def test_tower_reads_half_precision_and_sharded_checkpoints(arch, dtype, shards, tmp_path):
    require_tool()
    model_dir = tmp_path / "ckpt"
    _load_script().build(arch, str(model_dir), seed=7, dtype=dtype, shards=shards)
    if shards > 1:
        assert (model_dir / "model.safetensors.index.json").is_file()
    tower = Tower(model_dir)
    item = tower.pre.image(photo("coffee.png"))
    (tmp_path / "run").mkdir()
    tower.compare([item], tmp_path / "run", f"{arch} {dtype} in {shards} shard(s)")


# ---------------------------------------------------------------------------
# Broken checkpoints: the tool exits 1 with a message naming what is wrong,
# and never crashes (a signal would show as a negative return code).


def _break_missing_tensor(d):
    tensors = ref.read_safetensors(d / "model.safetensors")
    del tensors["visual.blocks.1.attn.proj.weight"]
    ref.write_safetensors(d / "model.safetensors", tensors, {"format": "pt"})
    return ["blocks.1.attn.proj.weight"]  # with or without the visual. prefix


def _break_wrong_shape(d):
    tensors = ref.read_safetensors(d / "model.safetensors")
    tensors["visual.blocks.0.mlp.gate_proj.bias"] = tensors["visual.blocks.0.mlp.gate_proj.bias"][:-1].clone()
    ref.write_safetensors(d / "model.safetensors", tensors, {"format": "pt"})
    return ["blocks.0.mlp.gate_proj.bias"]


def _break_truncated_shard(d):
    path = d / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return []


def _break_header_claims_too_much(d):
    path = d / "model.safetensors"
    data = bytearray(path.read_bytes())
    # A header length far beyond the file's size.
    data[:8] = (len(data) * 4).to_bytes(8, "little")
    path.write_bytes(bytes(data))
    return []


def _break_index_names_missing_shard(d):
    (d / "model.safetensors").rename(d / "model-00001-of-00002.safetensors")
    header, _ = ref.read_safetensors_header(d / "model-00001-of-00002.safetensors")
    names = [n for n in header if n != "__metadata__"]
    weight_map = {n: "model-00001-of-00002.safetensors" for n in names}
    weight_map["visual.merger.mlp.2.weight"] = "model-00002-of-00002.safetensors"
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    return ["model-00002-of-00002.safetensors"]


def _break_unknown_model_type(d):
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = "llava_next"
    cfg["architectures"] = ["LlavaNextForConditionalGeneration"]
    (d / "config.json").write_text(json.dumps(cfg))
    return ["llava_next"]


@pytest.mark.parametrize("breakage", [_break_missing_tensor, _break_wrong_shape, _break_truncated_shard,
                                      _break_header_claims_too_much, _break_index_names_missing_shard,
                                      _break_unknown_model_type], ids=lambda f: f.__name__[len("_break_"):])
def test_tool_rejects_a_broken_checkpoint_with_a_message(breakage, tmp_path):
    exe = require_tool()
    model_dir = tmp_path / "ckpt"
    _load_script().build("qwen2_5_vl", str(model_dir))
    must_name = breakage(model_dir)
    pre = ref.Preprocess(json.loads((model_dir / "preprocessor_config.json").read_text()))
    pixel_values, grid = pre.image(photo("chelsea.png"), size=(56, 56))
    inp, out = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    ref.write_safetensors(inp, {"pixel_values": pixel_values, "grid_thw": np.array([grid], dtype=np.int64)})
    proc = subprocess.run([str(exe), "--model", str(model_dir), "--in", str(inp), "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, f"exit {proc.returncode}, stderr: {proc.stderr.strip()}"
    assert proc.stderr.strip(), "no message on stderr"
    for name in must_name:
        assert name in proc.stderr, f"stderr does not name {name!r}: {proc.stderr.strip()}"


@pytest.mark.parametrize("arch", ref.ARCHS)
def test_tower_video_equals_its_temporal_chunks_encoded_one_by_one(arch, tmp_path):
    """docs/VIDEO.md, "Caching": the C++ tower given a t=3 video as three
    items of grid (1, h, w), one per temporal patch, gives the rows the
    independent reference gives for the whole video as one item of grid
    (3, h, w) (Qwen2.5-VL's 7 x 5-block frames cut its windows short)."""
    tower = Tower.get(tiny_checkpoint(arch))
    f = tower.pre.factor
    names = ["astronaut.png", "coffee.png", "chelsea.png", "coffee.png", "astronaut.png", "chelsea.png"]
    pixel_values, grid = tower.pre.video([photo(n) for n in names], size=(7 * f, 5 * f))
    t, h, w = grid
    assert t == 3
    rows = h * w
    chunks = [(pixel_values[k * rows:(k + 1) * rows], (1, h, w)) for k in range(t)]
    got_main, got_ds = tower.tool(chunks, tmp_path)
    want_main, want_ds = tower.reference([(pixel_values, tuple(grid))])
    assert_close(got_main, want_main, f"{arch} video t=3 as chunks: main")
    if want_ds is not None:
        assert_close(got_ds, want_ds, f"{arch} video t=3 as chunks: deepstack")
