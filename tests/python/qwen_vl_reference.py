"""An independent, eager reference for the Qwen2-VL, Qwen2.5-VL and Qwen3-VL
vision towers, loaded straight from a Hugging Face checkpoint directory.

Purpose: the tests compare epd-encode's libtorch towers (src/tower/) against
this file. It shares no code with them and is written to be read, not to be
fast: every step is the plain textbook operation.

  * the patch embedding is a real nn.Conv3d over [C, temporal_patch, p, p];
  * rotary angles are computed per token from its (row, col) in its frame;
  * attention loops over segments (one frame, or one window of a frame),
    gathers that segment's tokens by index in their original order, and runs
    softmax(q k^T / sqrt(d)) v on them;
  * Qwen2.5-VL's window attention therefore needs no token permutation at all;
    the permuted formulation the model card describes (tokens reordered
    window by window, attention over contiguous runs, the inverse order
    restored after the merger) is provided too (`window_order`,
    window_mode="permute") so the tests can check that both agree;
  * Qwen3-VL's learned position table is resized with
    F.interpolate(bilinear, align_corners=True) per grid.

By default the forward pass runs in float64, so that a float32 implementation
compared against it is judged by its own rounding only.

Architecture sources (facts and constants only; no code copied):
transformers/models/qwen2_vl/modeling_qwen2_vl.py,
transformers/models/qwen2_5_vl/modeling_qwen2_5_vl.py,
transformers/models/qwen3_vl/modeling_qwen3_vl.py, and
transformers/models/qwen2_vl/image_processing_qwen2_vl.py for preprocessing;
the Qwen2-VL report (arXiv:2409.12191) and Qwen2.5-VL report (arXiv:2502.13923).

Layout conventions (those of the Hugging Face processor):
  pixel_values  [N, C * temporal_patch * p * p], one row per patch, flattened
                in (channel, time, row, col) order;
  grid_thw      [n_items, 3] = (t, h, w) in patches; an item's patches are
                ordered frame by frame, and within a frame by
                (block_row, block_col, row_in_block, col_in_block) with
                merge_size x merge_size blocks, so each run of merge_size**2
                consecutive rows is one post-merge token.
  outputs       main [T, out_hidden] with T = sum(t * h * w) / merge_size**2,
                item by item in the same order; deepstack
                [T, out_hidden * len(deepstack_visual_indexes)] (Qwen3-VL),
                taps concatenated along the feature axis in index order.
"""

import json
import math
import os
import struct

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

ARCHS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")

# ---------------------------------------------------------------------------
# safetensors (https://github.com/huggingface/safetensors, "Format"): 8-byte
# little-endian header length, JSON header, raw little-endian tensor bytes.

_NP_DTYPE = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "I64": "<i8", "I32": "<i4", "U8": "u1"}


def _decode(dtype, raw, shape):
    if dtype == "BF16":
        # bf16 is the upper half of a float32.
        bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return torch.from_numpy(bits.view(np.float32).reshape(shape).copy())
    if dtype not in _NP_DTYPE:
        raise ValueError(f"unsupported safetensors dtype {dtype}")
    return torch.from_numpy(np.frombuffer(raw, dtype=_NP_DTYPE[dtype]).reshape(shape).copy())


def read_safetensors_header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n).decode("utf-8")), 8 + n


def read_safetensors(path, names=None):
    """Tensors of one safetensors file as {name: torch.Tensor} (BF16 widened to
    float32, other dtypes kept). `names`: only these (default: all)."""
    header, data_start = read_safetensors_header(path)
    out = {}
    with open(path, "rb") as f:
        for name, info in header.items():
            if name == "__metadata__" or (names is not None and name not in names):
                continue
            begin, end = info["data_offsets"]
            f.seek(data_start + begin)
            out[name] = _decode(info["dtype"], f.read(end - begin), info["shape"])
    return out


def write_safetensors(path, tensors, metadata=None):
    """Writes {name: numpy array or torch tensor} (float32, float16, float64,
    int64, int32) as one safetensors file."""
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = dict(metadata)
    for name in sorted(tensors):
        arr = tensors[name]
        if isinstance(arr, torch.Tensor):
            arr = arr.detach().cpu().numpy()
        arr = np.ascontiguousarray(arr)
        code = {np.dtype("float32"): "F32", np.dtype("float16"): "F16", np.dtype("float64"): "F64",
                np.dtype("int64"): "I64", np.dtype("int32"): "I32"}[arr.dtype]
        raw = arr.astype(_NP_DTYPE[code]).tobytes()
        header[name] = {"dtype": code, "shape": list(arr.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for raw in blobs:
            f.write(raw)


# ---------------------------------------------------------------------------
# Checkpoint directory


def detect_arch(config):
    model_type = config.get("model_type", "")
    if model_type in ARCHS:
        return model_type
    for name in config.get("architectures", []):
        for arch, cls in (("qwen2_5_vl", "Qwen2_5_VL"), ("qwen3_vl", "Qwen3VL"), ("qwen2_vl", "Qwen2VL")):
            if name.startswith(cls):
                return arch
    raise ValueError(f"unknown model_type {model_type!r}; supported: {', '.join(ARCHS)}")


def load_checkpoint(model_dir):
    """(arch, config, preprocessor_config, {vision tensor name without prefix: tensor})."""
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(model_dir, "preprocessor_config.json")) as f:
        preproc = json.load(f)
    arch = detect_arch(config)
    index_path = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index_path):
        with open(index_path) as f:
            weight_map = json.load(f)["weight_map"]
        files = sorted(set(weight_map.values()))
    else:
        files = ["model.safetensors"]
    prefixes = ("model.visual.", "visual.")
    state = {}
    for fname in files:
        path = os.path.join(model_dir, fname)
        header, _ = read_safetensors_header(path)
        wanted = [n for n in header if n.startswith(prefixes)]
        for name, tensor in read_safetensors(path, set(wanted)).items():
            short = name[len("model.visual."):] if name.startswith("model.visual.") else name[len("visual."):]
            state[short] = tensor
    return arch, config, preproc, state


# ---------------------------------------------------------------------------
# Preprocessing, as the Hugging Face Qwen2-VL image processor (the slow, PIL
# path) does it; Qwen2.5-VL and Qwen3-VL use the same steps with their own
# numbers from preprocessor_config.json.


class Preprocess:
    def __init__(self, preproc):
        self.patch_size = int(preproc["patch_size"])
        self.merge_size = int(preproc["merge_size"])
        self.temporal_patch_size = int(preproc["temporal_patch_size"])
        size = preproc.get("size") or {}
        # Qwen3-VL writes only size {shortest_edge, longest_edge} (pixel counts,
        # despite the names); the Qwen2 family also writes min/max_pixels.
        self.min_pixels = int(preproc.get("min_pixels", size.get("shortest_edge", 56 * 56)))
        self.max_pixels = int(preproc.get("max_pixels", size.get("longest_edge", 28 * 28 * 1280)))
        self.mean = np.array(preproc["image_mean"], dtype=np.float64)
        self.std = np.array(preproc["image_std"], dtype=np.float64)
        self.rescale = float(preproc.get("rescale_factor", 1.0 / 255.0))

    @property
    def factor(self):
        return self.patch_size * self.merge_size

    def smart_resize(self, height, width):
        """Target (height, width): multiples of the factor, near the original aspect,
        with min_pixels <= h * w <= max_pixels (Python's round(): half to even)."""
        f = self.factor
        if min(height, width) < f:
            raise ValueError(f"image {width}x{height} is smaller than the factor {f}")
        if max(height, width) / min(height, width) > 200:
            raise ValueError(f"aspect ratio of {width}x{height} exceeds 200")
        h, w = round(height / f) * f, round(width / f) * f
        if h * w > self.max_pixels:
            beta = math.sqrt(height * width / self.max_pixels)
            h, w = math.floor(height / beta / f) * f, math.floor(width / beta / f) * f
        elif h * w < self.min_pixels:
            beta = math.sqrt(self.min_pixels / (height * width))
            h, w = math.ceil(height * beta / f) * f, math.ceil(width * beta / f) * f
        return h, w

    def frames_to_array(self, images, size=None):
        """PIL images -> float64 [n, C, H, W], resized (bicubic), rescaled and normalised.
        All frames get the size of the first one's smart_resize, or `size` (h, w)."""
        from PIL import Image

        if size is None:
            size = self.smart_resize(images[0].height, images[0].width)
        h, w = size
        out = []
        for im in images:
            im = im.convert("RGB").resize((w, h), resample=Image.BICUBIC)
            x = np.asarray(im, dtype=np.float64) * self.rescale
            x = (x - self.mean) / self.std
            out.append(x.transpose(2, 0, 1))
        return np.stack(out)

    def patchify(self, frames):
        """float [n, C, H, W] -> (pixel_values float32 [t*h*w, C*tps*p*p], (t, h, w)).
        The last frame is repeated up to a multiple of temporal_patch_size."""
        tps, p, m = self.temporal_patch_size, self.patch_size, self.merge_size
        n, c, height, width = frames.shape
        if n % tps:
            frames = np.concatenate([frames, np.repeat(frames[-1:], tps - n % tps, axis=0)])
        t, gh, gw = frames.shape[0] // tps, height // p, width // p
        rows = []
        # Written as loops over the output order to keep the layout obvious.
        for ti in range(t):
            clip = frames[ti * tps:(ti + 1) * tps]  # [tps, C, H, W]
            for hb in range(gh // m):
                for wb in range(gw // m):
                    for hi in range(m):
                        for wi in range(m):
                            r, col = (hb * m + hi) * p, (wb * m + wi) * p
                            patch = clip[:, :, r:r + p, col:col + p]  # [tps, C, p, p]
                            rows.append(patch.transpose(1, 0, 2, 3).reshape(-1))
        return np.stack(rows).astype(np.float32), (t, gh, gw)

    def image(self, pil_image, size=None):
        return self.patchify(self.frames_to_array([pil_image], size))

    def video(self, pil_frames, size=None):
        return self.patchify(self.frames_to_array(pil_frames, size))


# ---------------------------------------------------------------------------
# The towers


def _activation(name):
    if name == "quick_gelu":
        return lambda x: x * torch.sigmoid(1.702 * x)
    if name == "silu":
        return F.silu
    if name == "gelu_pytorch_tanh":
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "gelu":
        return F.gelu
    raise ValueError(f"unsupported hidden_act {name!r}")


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return self.weight * x / torch.sqrt((x * x).mean(-1, keepdim=True) + self.eps)


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x, cos, sin, segments):
        """x [S, D]; cos/sin [S, head_dim]; segments: list of LongTensor index sets
        that together cover 0..S-1 once. Each token attends to its segment only."""
        s, d = x.shape
        hd = d // self.heads
        q, k, v = self.qkv(x).view(s, 3, self.heads, hd).unbind(1)  # [S, H, hd] each

        def rotate(t):
            first, second = t[..., : hd // 2], t[..., hd // 2:]
            turned = torch.cat([-second, first], dim=-1)
            return t * cos[:, None, :] + turned * sin[:, None, :]

        q, k = rotate(q), rotate(k)
        out = torch.zeros_like(q)
        for idx in segments:
            qs, ks, vs = q[idx].transpose(0, 1), k[idx].transpose(0, 1), v[idx].transpose(0, 1)  # [H, n, hd]
            weights = torch.softmax(qs @ ks.transpose(1, 2) / math.sqrt(hd), dim=-1)
            out[idx] = (weights @ vs).transpose(0, 1)
        return self.proj(out.reshape(s, d))


class Qwen2VLMlp(nn.Module):
    def __init__(self, dim, hidden, act):
        super().__init__()
        self.fc1, self.fc2, self.act = nn.Linear(dim, hidden), nn.Linear(hidden, dim), act

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class SwiGluMlp(nn.Module):
    def __init__(self, dim, hidden, act):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(dim, hidden), nn.Linear(dim, hidden)
        self.down_proj, self.act = nn.Linear(hidden, dim), act

    def forward(self, x):
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class Qwen3Mlp(nn.Module):
    def __init__(self, dim, hidden, act):
        super().__init__()
        self.linear_fc1, self.linear_fc2, self.act = nn.Linear(dim, hidden), nn.Linear(hidden, dim), act

    def forward(self, x):
        return self.linear_fc2(self.act(self.linear_fc1(x)))


class Block(nn.Module):
    def __init__(self, norm1, norm2, attn, mlp):
        super().__init__()
        self.norm1, self.norm2, self.attn, self.mlp = norm1, norm2, attn, mlp

    def forward(self, x, cos, sin, segments):
        x = x + self.attn(self.norm1(x), cos, sin, segments)
        return x + self.mlp(self.norm2(x))


class Qwen2Merger(nn.Module):
    """LayerNorm/RMSNorm per patch, then merge_size**2 consecutive patches folded
    into one row, then Linear-GELU-Linear. Tensor names: ln_q, mlp.0, mlp.2."""

    def __init__(self, dim, units, out, rms):
        super().__init__()
        self.units = units
        self.ln_q = RMSNorm(dim) if rms else nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim * units, dim * units), nn.GELU(), nn.Linear(dim * units, out))

    def forward(self, x):
        return self.mlp(self.ln_q(x).reshape(-1, x.shape[1] * self.units))


class Qwen3Merger(nn.Module):
    """As Qwen2Merger with LayerNorm, except that a deepstack merger normalises
    the folded row (post-shuffle) instead of each patch."""

    def __init__(self, dim, units, out, post_shuffle):
        super().__init__()
        self.units, self.post_shuffle = units, post_shuffle
        self.norm = nn.LayerNorm(dim * units if post_shuffle else dim, eps=1e-6)
        self.linear_fc1 = nn.Linear(dim * units, dim * units)
        self.linear_fc2 = nn.Linear(dim * units, out)

    def forward(self, x):
        if self.post_shuffle:
            folded = self.norm(x.reshape(-1, x.shape[1] * self.units))
        else:
            folded = self.norm(x).reshape(-1, x.shape[1] * self.units)
        return self.linear_fc2(F.gelu(self.linear_fc1(folded)))


class VisionTower(nn.Module):
    """One of the three towers, with module names equal to the checkpoint's
    tensor names (minus the visual prefix), so load_state_dict(strict=True)
    also checks that the checkpoint holds exactly the expected tensors."""

    def __init__(self, arch, vision_config):
        super().__init__()
        v = vision_config
        self.arch = arch
        self.patch = int(v["patch_size"])
        self.tps = int(v["temporal_patch_size"])
        self.merge = int(v["spatial_merge_size"])
        self.channels = int(v.get("in_chans", v.get("in_channels", 3)))
        self.dim = int(v["embed_dim"] if arch == "qwen2_vl" else v["hidden_size"])
        self.heads = int(v["num_heads"])
        self.out_dim = int(v["hidden_size"] if arch == "qwen2_vl" else v["out_hidden_size"])
        depth = int(v["depth"])
        units = self.merge * self.merge
        act = _activation(v.get("hidden_act", "quick_gelu"))
        kernel = (self.tps, self.patch, self.patch)
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv3d(self.channels, self.dim, kernel, stride=kernel, bias=arch == "qwen3_vl")

        def make_block():
            if arch == "qwen2_vl":
                n1, n2 = nn.LayerNorm(self.dim, eps=1e-6), nn.LayerNorm(self.dim, eps=1e-6)
                mlp = Qwen2VLMlp(self.dim, int(self.dim * v["mlp_ratio"]), act)
            elif arch == "qwen2_5_vl":
                n1, n2 = RMSNorm(self.dim), RMSNorm(self.dim)
                mlp = SwiGluMlp(self.dim, int(v["intermediate_size"]), act)
            else:
                n1, n2 = nn.LayerNorm(self.dim, eps=1e-6), nn.LayerNorm(self.dim, eps=1e-6)
                mlp = Qwen3Mlp(self.dim, int(v["intermediate_size"]), act)
            return Block(n1, n2, Attention(self.dim, self.heads), mlp)

        self.blocks = nn.ModuleList([make_block() for _ in range(depth)])
        self.fullatt = set(v.get("fullatt_block_indexes", [])) if arch == "qwen2_5_vl" else None
        # Window side in post-merge tokens: 112 px / 14 px / 2 = 4 (Qwen2.5-VL).
        self.window_tokens = (int(v["window_size"]) // self.patch // self.merge) if arch == "qwen2_5_vl" else None
        self.deepstack_indexes = list(v.get("deepstack_visual_indexes", [])) if arch == "qwen3_vl" else []
        if arch == "qwen3_vl":
            self.pos_embed = nn.Embedding(int(v["num_position_embeddings"]), self.dim)
            self.pos_side = int(round(math.sqrt(int(v["num_position_embeddings"]))))
            if self.pos_side ** 2 != int(v["num_position_embeddings"]):
                raise ValueError("num_position_embeddings must be a perfect square")
            self.merger = Qwen3Merger(self.dim, units, self.out_dim, post_shuffle=False)
            self.deepstack_merger_list = nn.ModuleList(
                [Qwen3Merger(self.dim, units, self.out_dim, post_shuffle=True) for _ in self.deepstack_indexes])
        else:
            self.merger = Qwen2Merger(self.dim, units, self.out_dim, rms=arch == "qwen2_5_vl")

    @property
    def patch_dim(self):
        return self.channels * self.tps * self.patch * self.patch

    @property
    def deepstack_layers(self):
        return len(self.deepstack_indexes)

    # -- token geometry ------------------------------------------------------

    def token_coords(self, grid_thw):
        """[N, 5] long: (item, frame, row, col, order) of every patch in input
        order; row/col are the patch's position in its frame."""
        m = self.merge
        out = []
        for item, (t, h, w) in enumerate(grid_thw.tolist()):
            for f in range(t):
                for hb in range(h // m):
                    for wb in range(w // m):
                        for hi in range(m):
                            for wi in range(m):
                                out.append((item, f, hb * m + hi, wb * m + wi))
        c = torch.tensor(out, dtype=torch.long).reshape(-1, 4)
        return c

    def frame_segments(self, coords):
        """One index set per (item, frame): cu_seqlens in the model's terms."""
        key = coords[:, 0] * 1_000_000 + coords[:, 1]
        return [torch.nonzero(key == k).flatten() for k in torch.unique(key)]

    def window_segments(self, coords):
        """One index set per (item, frame, window): windows are squares of
        window_tokens x window_tokens post-merge tokens (8 x 8 patches at
        Qwen2.5-VL's sizes), anchored at the frame's top-left; those at the
        right and bottom edges are cut short."""
        side = self.window_tokens * self.merge
        wr, wc = coords[:, 2] // side, coords[:, 3] // side
        key = ((coords[:, 0] * 10_000 + coords[:, 1]) * 10_000 + wr) * 10_000 + wc
        return [torch.nonzero(key == k).flatten() for k in torch.unique(key)]

    def window_order(self, coords):
        """The permutation Qwen2.5-VL applies before its blocks: tokens sorted by
        (item, frame, window row, window col, block row, block col, row in
        block, col in block), so each window is a contiguous run."""
        m, side = self.merge, self.window_tokens * self.merge
        r, c = coords[:, 2], coords[:, 3]
        keys = [coords[:, 0], coords[:, 1], r // side, c // side, r // m, c // m, r % m, c % m]
        order = torch.arange(coords.shape[0])
        for k in reversed(keys):  # stable sorts, least significant key first
            order = order[torch.sort(k[order], stable=True).indices]
        return order

    def rotary(self, coords, dtype):
        """cos, sin [N, head_dim] of the 2D rotary embedding: the first half of
        each rotated pair set encodes the row, the second the column, with
        inv_freq_j = 10000 ** (-j / (head_dim / 4)), j < head_dim / 4."""
        hd = self.dim // self.heads
        quarter = hd // 4
        inv = 1.0 / (10000.0 ** (torch.arange(quarter, dtype=torch.float64) * 2 / (hd // 2)))
        angles = torch.cat([coords[:, 2:3].double() * inv, coords[:, 3:4].double() * inv], dim=1)
        angles = torch.cat([angles, angles], dim=1)
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def position_embedding(self, grid_thw, coords):
        """Qwen3-VL: the learned [side, side] table resized bilinearly (corners
        aligned) to each grid's (h, w), looked up at each patch's (row, col)."""
        table = self.pos_embed.weight.reshape(self.pos_side, self.pos_side, -1).permute(2, 0, 1)[None]
        out = torch.empty(coords.shape[0], self.dim, dtype=table.dtype)
        for item, (t, h, w) in enumerate(grid_thw.tolist()):
            resized = F.interpolate(table, size=(h, w), mode="bilinear", align_corners=True)[0]  # [D, h, w]
            idx = torch.nonzero(coords[:, 0] == item).flatten()
            out[idx] = resized[:, coords[idx, 2], coords[idx, 3]].T
        return out

    # -- forward --------------------------------------------------------------

    def forward(self, pixel_values, grid_thw, window_mode="gather"):
        """pixel_values [N, patch_dim] (any float), grid_thw [n_items, 3] ->
        (main [T, out_dim], deepstack [T, out_dim * deepstack_layers] or None),
        in the dtype of the module's parameters."""
        dtype = self.patch_embed.proj.weight.dtype
        grid_thw = torch.as_tensor(grid_thw, dtype=torch.long).reshape(-1, 3)
        coords = self.token_coords(grid_thw)
        if coords.shape[0] != pixel_values.shape[0]:
            raise ValueError(f"grid_thw covers {coords.shape[0]} patches, pixel_values has {pixel_values.shape[0]}")
        x = torch.as_tensor(pixel_values).to(dtype).reshape(-1, self.channels, self.tps, self.patch, self.patch)
        x = self.patch_embed.proj(x).reshape(-1, self.dim)
        if self.arch == "qwen3_vl":
            x = x + self.position_embedding(grid_thw, coords)
        cos, sin = self.rotary(coords, dtype)
        frames = self.frame_segments(coords)
        windows = self.window_segments(coords) if self.arch == "qwen2_5_vl" else None

        order = None
        if self.arch == "qwen2_5_vl" and window_mode == "permute":
            # The model-card formulation: reorder, attend over contiguous runs, undo.
            order = self.window_order(coords)
            x, cos, sin, coords = x[order], cos[order], sin[order], coords[order]
            frames, windows = self._runs(coords, frame_only=True), self._runs(coords, frame_only=False)

        taps = []
        for i, block in enumerate(self.blocks):
            use_windows = self.arch == "qwen2_5_vl" and i not in self.fullatt
            x = block(x, cos, sin, windows if use_windows else frames)
            if i in self.deepstack_indexes:
                taps.append((self.deepstack_indexes.index(i), i, x))
        main = self.merger(x)
        if order is not None:
            # The merger folded runs of merge**2 rows; the permutation moved whole
            # runs, so undo it at post-merge granularity.
            unit_order = order.reshape(-1, self.merge * self.merge)[:, 0] // (self.merge * self.merge)
            main = main[torch.argsort(unit_order)]
        deepstack = None
        if self.deepstack_indexes:
            feats = [None] * len(self.deepstack_indexes)
            for j, _, h in taps:
                feats[j] = self.deepstack_merger_list[j](h)
            deepstack = torch.cat(feats, dim=1)
        return main, deepstack

    def _runs(self, coords, frame_only):
        """Contiguous runs of equal (item, frame[, window]) in an already permuted order."""
        side = self.window_tokens * self.merge
        key = coords[:, 0] * 1_000_000 + coords[:, 1]
        if not frame_only:
            key = (key * 10_000 + coords[:, 2] // side) * 10_000 + coords[:, 3] // side
        runs, start = [], 0
        for i in range(1, key.shape[0] + 1):
            if i == key.shape[0] or key[i] != key[start]:
                runs.append(torch.arange(start, i))
                start = i
        return runs


def load_tower(model_dir, dtype=torch.float64):
    """(tower in eval mode with the checkpoint's weights in `dtype`, arch, config, Preprocess)."""
    arch, config, preproc, state = load_checkpoint(model_dir)
    tower = VisionTower(arch, config["vision_config"])
    tower.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    tower = tower.to(dtype).eval()
    return tower, arch, config, Preprocess(preproc)


@torch.no_grad()
def run(tower, pixel_values, grid_thw, **kwargs):
    """Forward pass without autograd; returns float32 tensors."""
    main, deepstack = tower(torch.as_tensor(pixel_values), grid_thw, **kwargs)
    return main.float(), (deepstack.float() if deepstack is not None else None)
