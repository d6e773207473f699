#!/usr/bin/env python3
"""Builds epd-encode's default vision tower: a small, randomly initialised
Qwen2-VL-style ViT saved as a TorchScript archive.

The tower exists so that the whole pipeline (preprocess -> tower -> cache ->
server) runs and is tested without downloading real weights. Its numbers are
meaningless, but its shapes, its per-image attention and its cost per patch
behave like a real tower's. The archive follows the contract in docs/TOWER.md:

  int attributes   patch_dim, merge_size, hidden_size, deepstack_layers
  forward(pixel_values: float32 [N, patch_dim], grid_thw: int64 [n_items, 3])
      -> (main [tokens, hidden_size], deepstack [tokens, hidden_size * deepstack_layers])

Architecture (each part names the model it imitates; sources are
transformers/models/qwen2_vl/modeling_qwen2_vl.py and
transformers/models/qwen3_vl/modeling_qwen3_vl.py, and the Qwen2-VL report,
arXiv:2409.12191, section 2.1):
  * Patch embedding: Linear(1176 -> D). Qwen2-VL embeds a patch with a Conv3d of
    kernel = stride = (2, 14, 14) over a [3, 2, 14, 14] patch, which is exactly a
    linear map of the patch flattened in (channel, time, row, col) order; the
    Qwen2-VL processor emits rows in that flattened order.
  * 2D rotary position embedding over each patch's (row, col) in its image,
    as Qwen2-VL's VisionRotaryEmbedding and rot_pos_emb: half of each head's
    rotary frequencies encode the row, the other half the column
    (inv_freq = 10000 ** (-2j / (head_dim / 2)), rotate-half convention).
  * `depth` pre-norm transformer blocks (LayerNorm, multi-head self-attention,
    LayerNorm, MLP with GELU). Attention is per item: the packed sequence is cut
    into items using grid_thw (cu_seqlens, as Qwen2-VL) and each item attends only
    to itself, so an image's embedding does not depend on its batch-mates.
  * PatchMerger (Qwen2-VL): LayerNorm(D), fold each run of merge_size**2
    consecutive rows (one 2x2 block, which the processor places consecutively)
    into one [4*D] row, MLP(4D -> 4D -> hidden).
  * Deepstack (Qwen3-VL's deepstack_visual_indexes / deepstack_merger_list):
    the hidden states after `deepstack_layers` blocks spread evenly through
    the stack each pass through their own merger (Qwen3-VL's
    use_postshuffle_norm variant, which normalises the folded [4*D] row) and
    are concatenated along the feature dimension, tap by tap.

Defaults: D = 128, depth 3, 2 heads (head_dim 64), MLP ratio 4, hidden 512,
2 deepstack taps (after blocks 1 and 2): 2.3 M parameters, 9.3 MB. Sized so one
512x512 image (grid 1x36x36: 1296 patches, 324 tokens) takes about 90 ms
through the C++ backend with 2 threads on the 2-core development machine;
attention over the 1296 patches dominates (docs/TOWER.md, "Speed").

Determinism: weights come from torch.manual_seed(seed) in a fixed creation
order, so a rerun with the same options gives the same weights and, with the
hash seed fixed below, the same archive bytes.

Usage:
  /usr/bin/python3 scripts/make_default_tower.py --out build/models/default_tower.pt
  /usr/bin/python3 scripts/make_default_tower.py --out nods.pt --deepstack-layers 0
"""

import argparse
import io
import math
import os
import sys
import time
from typing import List, Tuple

# TorchScript serialises some per-class sets (the Final constants) in Python's
# set order, which depends on string hashing; a fixed hash seed makes the
# archive byte-identical across runs. Re-exec once with it before torch loads.
if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch  # noqa: E402
from torch import Tensor, nn  # noqa: E402


class VisionRotaryEmbedding(nn.Module):
    """Rotary frequencies for integer positions, as Qwen2-VL's VisionRotaryEmbedding:
    inv_freq[j] = theta ** (-2j / dim), angle = position * inv_freq."""

    def __init__(self, dim: int, theta: float = 10000.0):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=True)

    def forward(self, positions: Tensor) -> Tensor:
        # positions: int64 [n] -> angles float32 [n, dim / 2]
        return positions.to(torch.float32).unsqueeze(1) * self.inv_freq.unsqueeze(0)


def rotate_half(x: Tensor) -> Tensor:
    half = x.size(-1) // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, seqlens: List[int]) -> Tensor:
        n = x.size(0)
        # [n, 3, heads, head_dim] -> three [heads, n, head_dim]
        qkv = self.qkv(x).reshape(n, 3, self.heads, self.head_dim).permute(1, 2, 0, 3)
        q, k, v = qkv[0], qkv[1], qkv[2]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        q = q * self.scale
        # Per-item attention over the packed sequence: a loop over items costs
        # sum(n_i^2) instead of the N^2 of a block-diagonal mask. The loop over
        # heads uses 2D matrix products, which libtorch 1.13's CPU build runs
        # about twice as fast as the batched 3D product.
        outs: List[Tensor] = []
        start = 0
        for length in seqlens:
            end = start + length
            heads: List[Tensor] = []
            for h in range(self.heads):
                qh = q[h, start:end]
                kh = k[h, start:end]
                vh = v[h, start:end]
                heads.append(torch.mm(torch.mm(qh, kh.t()).softmax(dim=-1), vh))
            outs.append(torch.cat(heads, dim=1))  # [length, heads * head_dim]
            start = end
        return self.proj(torch.cat(outs, dim=0))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_ratio: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(
            nn.Linear(dim, mlp_ratio * dim), nn.GELU(), nn.Linear(mlp_ratio * dim, dim)
        )

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, seqlens: List[int]) -> Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, seqlens)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    """Folds each merge_size**2 consecutive rows into one token (Qwen2-VL).

    post_shuffle_norm=False: LayerNorm over D, then fold (Qwen2-VL's merger).
    post_shuffle_norm=True: fold, then LayerNorm over merge**2 * D (Qwen3-VL's
    deepstack mergers)."""

    def __init__(self, dim: int, out_dim: int, merge_size: int, post_shuffle_norm: bool):
        super().__init__()
        self.folded = dim * merge_size * merge_size
        self.post_shuffle_norm = post_shuffle_norm
        self.norm = nn.LayerNorm(self.folded if post_shuffle_norm else dim, eps=1e-6)
        self.mlp = nn.Sequential(
            nn.Linear(self.folded, self.folded), nn.GELU(), nn.Linear(self.folded, out_dim)
        )

    def forward(self, x: Tensor) -> Tensor:
        if self.post_shuffle_norm:
            x = self.norm(x.reshape(-1, self.folded))
        else:
            x = self.norm(x).reshape(-1, self.folded)
        return self.mlp(x)


class DefaultTower(nn.Module):
    # Class-level annotation so TorchScript types the list even when empty.
    deepstack_after: List[int]

    def __init__(self, embed_dim: int, depth: int, heads: int, hidden: int,
                 deepstack_layers: int, merge_size: int = 2, patch: int = 14,
                 temporal_patch: int = 2, mlp_ratio: int = 4):
        super().__init__()
        if embed_dim % heads != 0 or (embed_dim // heads) % 4 != 0:
            raise ValueError("embed_dim / heads must be a multiple of 4 (2D rotary)")
        if not 0 <= deepstack_layers <= depth:
            raise ValueError("deepstack_layers must be in [0, depth]")
        # The contract attributes (read by the C++ backend).
        self.patch_dim: int = 3 * temporal_patch * patch * patch
        self.merge_size: int = merge_size
        self.hidden_size: int = hidden
        self.deepstack_layers: int = deepstack_layers
        # Deepstack taps, evenly spaced through the stack as Qwen3-VL spaces
        # its 3 taps through 27 blocks: tap i follows block
        # ceil((i + 1) * depth / (k + 1)) (1-based), e.g. depth 3, k 2 -> after
        # blocks 1 and 2; depth 4, k 2 -> after 2 and 3; distinct for every
        # k <= depth.
        self.deepstack_after = [
            -(-(i + 1) * depth // (deepstack_layers + 1)) for i in range(deepstack_layers)
        ]

        self.patch_embed = nn.Linear(self.patch_dim, embed_dim, bias=False)
        head_dim = embed_dim // heads
        self.rotary = VisionRotaryEmbedding(head_dim // 2)
        self.blocks = nn.ModuleList([Block(embed_dim, heads, mlp_ratio) for _ in range(depth)])
        self.merger = PatchMerger(embed_dim, hidden, merge_size, post_shuffle_norm=False)
        self.deepstack_mergers = nn.ModuleList(
            [PatchMerger(embed_dim, hidden, merge_size, post_shuffle_norm=True)
             for _ in range(deepstack_layers)]
        )

    def positions(self, grid: List[List[int]]) -> Tuple[Tensor, Tensor]:
        """(row, col) of every packed row, in the processor's order: per frame,
        2x2 merge blocks in raster order, each block's 4 patches in raster order
        (Qwen2-VL rot_pos_emb)."""
        m = self.merge_size
        rows: List[Tensor] = []
        cols: List[Tensor] = []
        for thw in grid:
            t, h, w = thw[0], thw[1], thw[2]
            r = torch.arange(h).unsqueeze(1).expand(h, w)
            c = torch.arange(w).unsqueeze(0).expand(h, w)
            r = r.reshape(h // m, m, w // m, m).permute(0, 2, 1, 3).flatten()
            c = c.reshape(h // m, m, w // m, m).permute(0, 2, 1, 3).flatten()
            rows.append(r.repeat(t))
            cols.append(c.repeat(t))
        return torch.cat(rows), torch.cat(cols)

    def forward(self, pixel_values: Tensor, grid_thw: Tensor) -> Tuple[Tensor, Tensor]:
        grid: List[List[int]] = grid_thw.tolist()
        seqlens: List[int] = [thw[0] * thw[1] * thw[2] for thw in grid]
        rows, cols = self.positions(grid)
        # Positions are built on the host from grid_thw; the rotary buffer
        # lives wherever the module was moved (cpu or cuda).
        rows = rows.to(pixel_values.device)
        cols = cols.to(pixel_values.device)
        # [n, head_dim / 2] angles: first half from the row, second from the column.
        angles = torch.cat((self.rotary(rows), self.rotary(cols)), dim=1)
        angles = torch.cat((angles, angles), dim=1)  # [n, head_dim]
        cos = angles.cos().unsqueeze(0)
        sin = angles.sin().unsqueeze(0)

        x = self.patch_embed(pixel_values)
        taps: List[Tensor] = []
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, seqlens)
            if (i + 1) in self.deepstack_after:
                taps.append(x)
        main = self.merger(x)
        deep: List[Tensor] = []
        for j, merger in enumerate(self.deepstack_mergers):
            deep.append(merger(taps[j]))
        if len(deep) == 0:
            return main, main.new_zeros((main.size(0), 0))
        return main, torch.cat(deep, dim=1)


def build(args: argparse.Namespace) -> torch.jit.ScriptModule:
    torch.manual_seed(args.seed)
    model = DefaultTower(args.embed_dim, args.depth, args.heads, args.hidden,
                         args.deepstack_layers)
    model.eval()
    return torch.jit.script(model)


def benchmark(module: torch.jit.ScriptModule, threads: int, grid_side: int, reps: int) -> None:
    """Prints the best of `reps` forwards (the best, because the machine is shared)."""
    torch.set_num_threads(threads)
    n = grid_side * grid_side
    x = torch.randn(n, module.patch_dim)
    g = torch.tensor([[1, grid_side, grid_side]], dtype=torch.int64)
    best = float("inf")
    with torch.inference_mode():
        for _ in range(3):  # the profiling executor optimises after its first runs
            module(x, g)
        for _ in range(reps):
            start = time.perf_counter()
            module(x, g)
            best = min(best, time.perf_counter() - start)
    print(f"grid 1x{grid_side}x{grid_side}: {best * 1e3:.1f} ms/forward, best of {reps} "
          f"({threads} threads)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="path of the TorchScript archive to write")
    p.add_argument("--embed-dim", type=int, default=128, help="ViT width D")
    p.add_argument("--depth", type=int, default=3, help="transformer blocks")
    p.add_argument("--heads", type=int, default=2, help="attention heads")
    p.add_argument("--hidden", type=int, default=512, help="output width (the LLM's hidden size)")
    p.add_argument("--deepstack-layers", type=int, default=2, help="deepstack taps, 0 for none")
    p.add_argument("--seed", type=int, default=20240917)
    p.add_argument("--bench", action="store_true",
                   help="also time one 512x512 image (grid 1x36x36) and print it")
    p.add_argument("--bench-threads", type=int, default=2, help="threads for --bench")
    args = p.parse_args()
    for name in ("embed_dim", "depth", "heads", "hidden", "bench_threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")

    try:
        module = build(args)
    except ValueError as e:
        p.error(str(e))
    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    # Saving to memory names the archive's root folder "archive" whatever the
    # output path, so the bytes depend only on the options. Write then rename
    # so an interrupted build never leaves a truncated archive behind.
    buffer = io.BytesIO()
    torch.jit.save(module, buffer)
    tmp = args.out + ".tmp"
    with open(tmp, "wb") as f:
        f.write(buffer.getvalue())
    os.replace(tmp, args.out)
    if args.bench:
        benchmark(module, threads=args.bench_threads, grid_side=36, reps=5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
