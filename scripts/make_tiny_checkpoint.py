#!/usr/bin/env python3
"""Writes a random Qwen-VL checkpoint directory in Hugging Face's on-disk layout.

The directory looks like one downloaded from the Hub, so the checkpoint loader
reads it exactly as it would read Qwen/Qwen2.5-VL-7B-Instruct:

  config.json                      model_type, architectures, vision_config
                                   (the field names each architecture's
                                   published config.json uses), text_config
  preprocessor_config.json         as the model's image processor writes it
  model.safetensors                one file, or with --shards N > 1:
  model-0000i-of-0000N.safetensors + model.safetensors.index.json
                                   ({"metadata": {"total_size": bytes},
                                     "weight_map": {tensor: shard file}})

Tensor names and prefixes are the real ones: `visual.*` for Qwen2-VL and
Qwen2.5-VL, `model.visual.*` for Qwen3-VL. A few small language-model tensors
(`model.embed_tokens.weight`, one decoder layer, `lm_head.weight`; under
`model.language_model.*` for Qwen3-VL) sit beside them, as in a real
checkpoint, so that a vision loader has something it must skip.

Architectures and their vision-tower tensors (sources: transformers'
models/{qwen2_vl,qwen2_5_vl,qwen3_vl}/configuration_*.py and modeling_*.py,
and the published config.json / preprocessor_config.json of
Qwen2-VL-7B-Instruct, Qwen2.5-VL-7B-Instruct and Qwen3-VL-8B-Instruct):

  qwen2_vl    patch_embed.proj.weight [D, C, tps, p, p] (no bias);
              blocks.i.{norm1,norm2}.{weight,bias} (LayerNorm),
              attn.qkv, attn.proj, mlp.fc1, mlp.fc2 (weight + bias);
              merger.ln_q.{weight,bias}, merger.mlp.{0,2}.{weight,bias}
  qwen2_5_vl  as qwen2_vl, but norms are RMSNorm (weight only), the MLP is
              mlp.{gate_proj,up_proj,down_proj} with biases, merger.ln_q is
              RMSNorm; window attention config (window_size,
              fullatt_block_indexes)
  qwen3_vl    patch_embed.proj.{weight,bias}; pos_embed.weight
              [num_position_embeddings, D]; blocks as qwen2_vl but
              mlp.{linear_fc1,linear_fc2}; merger.{norm,linear_fc1,linear_fc2};
              deepstack_merger_list.j.{norm,linear_fc1,linear_fc2}

Sizes (--size):
  tiny  a few blocks, width 32-64, 2 heads, real patch/merge/window sizes
        and real processor defaults (so token counts match the real model).
  default  (qwen2_5_vl only) the checkpoint epd-encode runs when no --model
        is given (the build writes it to build/models/default-qwen2_5_vl):
        4 blocks, width 128, 2 heads, SwiGLU intermediate 256, out 512,
        window 112 px with full attention at blocks 1 and 3, real
        patch/merge/processor values except max_pixels 1003520 (1280 merged
        tokens of 28x28, the cap Qwen2-VL's model card suggests and the
        TorchScript default's), so the demo's token counts stay those of the
        TorchScript default. About 1.3 M vision parameters, sized
        like the TorchScript default tower (scripts/make_default_tower.py:
        width 128, 3 blocks, 2 heads, out 512) so the demo's timing stays
        comparable.
  7b    the published vision_config of the 7B/8B model of the architecture
        (Qwen2.5-VL-7B: 32 blocks, width 1280, 16 heads, MLP 3420, out 3584,
        window 112, full attention at blocks 7/15/23/31). About 670 M tower
        parameters: 1.3 GB in bf16. For a GPU benchmark; never built by CMake.
  --config-from FILE overrides vision_config fields from a config.json (its
  "vision_config" object, or the file itself when it has none).

Weights: numpy's legacy RandomState(seed), whose stream numpy keeps frozen
across releases, draws every tensor in sorted-name order; linear weights have
std 1/sqrt(fan_in) so activations keep unit scale through the blocks, biases
std 0.1, norm weights 1 + N(0, 0.1^2). bf16 is float32 rounded to nearest even.
The same options therefore give the same bytes on any machine; nothing is
downloaded, and only numpy is needed.

Usage:
  /usr/bin/python3 scripts/make_tiny_checkpoint.py --arch qwen2_5_vl --out build/models/tiny-qwen2_5_vl
  /usr/bin/python3 scripts/make_tiny_checkpoint.py --arch qwen3_vl --out /tmp/q3 --dtype bf16 --shards 3
  /usr/bin/python3 scripts/make_tiny_checkpoint.py --arch qwen2_5_vl --size default --out build/models/default-qwen2_5_vl
  /usr/bin/python3 scripts/make_tiny_checkpoint.py --arch qwen2_5_vl --size 7b --dtype bf16 --out /tmp/q25-7b
"""

import argparse
import copy
import json
import math
import os
import struct
import sys

import numpy as np

ARCHS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")

# CLIP's normalisation, used by the Qwen2 family's processors
# (OPENAI_CLIP_MEAN / OPENAI_CLIP_STD in transformers' image_utils.py).
_CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
_CLIP_STD = [0.26862954, 0.26130258, 0.27577711]

# vision_config per architecture and size. Field names are those of the
# published config.json files (Qwen2/2.5 write "in_chans", Qwen3 "in_channels").
_VISION = {
    ("qwen2_vl", "tiny"): {
        "depth": 3, "embed_dim": 32, "hidden_size": 48, "hidden_act": "quick_gelu",
        "mlp_ratio": 4, "num_heads": 2, "in_chans": 3, "patch_size": 14,
        "spatial_merge_size": 2, "spatial_patch_size": 14, "temporal_patch_size": 2,
    },
    ("qwen2_vl", "7b"): {  # Qwen2-VL-7B-Instruct
        "depth": 32, "embed_dim": 1280, "hidden_size": 3584, "hidden_act": "quick_gelu",
        "mlp_ratio": 4, "num_heads": 16, "in_chans": 3, "patch_size": 14,
        "spatial_merge_size": 2, "spatial_patch_size": 14, "temporal_patch_size": 2,
    },
    ("qwen2_5_vl", "tiny"): {
        "depth": 4, "hidden_act": "silu", "hidden_size": 64, "intermediate_size": 96,
        "num_heads": 2, "in_chans": 3, "out_hidden_size": 48, "patch_size": 14,
        "spatial_merge_size": 2, "spatial_patch_size": 14, "window_size": 112,
        "fullatt_block_indexes": [1, 3], "tokens_per_second": 2, "temporal_patch_size": 2,
    },
    ("qwen2_5_vl", "default"): {  # epd-encode's default model (see --size above)
        "depth": 4, "hidden_act": "silu", "hidden_size": 128, "intermediate_size": 256,
        "num_heads": 2, "in_chans": 3, "out_hidden_size": 512, "patch_size": 14,
        "spatial_merge_size": 2, "spatial_patch_size": 14, "window_size": 112,
        "fullatt_block_indexes": [1, 3], "tokens_per_second": 2, "temporal_patch_size": 2,
    },
    ("qwen2_5_vl", "7b"): {  # Qwen2.5-VL-7B-Instruct
        "depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420,
        "num_heads": 16, "in_chans": 3, "out_hidden_size": 3584, "patch_size": 14,
        "spatial_merge_size": 2, "spatial_patch_size": 14, "window_size": 112,
        "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2, "temporal_patch_size": 2,
    },
    ("qwen3_vl", "tiny"): {
        # 64 learned positions = an 8x8 table, smaller than any real grid, so
        # every image exercises the bilinear interpolation.
        "deepstack_visual_indexes": [0, 2], "depth": 4, "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": 48, "in_channels": 3, "initializer_range": 0.02, "intermediate_size": 96,
        "model_type": "qwen3_vl", "num_heads": 2, "num_position_embeddings": 64,
        "out_hidden_size": 40, "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
    },
    ("qwen3_vl", "7b"): {  # Qwen3-VL-8B-Instruct
        "deepstack_visual_indexes": [8, 16, 24], "depth": 27, "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": 1152, "in_channels": 3, "initializer_range": 0.02, "intermediate_size": 4304,
        "model_type": "qwen3_vl", "num_heads": 16, "num_position_embeddings": 2304,
        "out_hidden_size": 4096, "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
    },
}

_ARCHITECTURES = {
    "qwen2_vl": "Qwen2VLForConditionalGeneration",
    "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
    "qwen3_vl": "Qwen3VLForConditionalGeneration",
}

_ST_DTYPE = {"f32": "F32", "bf16": "BF16", "f16": "F16"}
_TORCH_DTYPE_NAME = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}
_ITEMSIZE = {"f32": 4, "bf16": 2, "f16": 2}


def vision_out_width(arch, vision):
    """Width of the tower's output rows (the language model's hidden size)."""
    return vision["hidden_size"] if arch == "qwen2_vl" else vision["out_hidden_size"]


def vision_width(arch, vision):
    """Width of the tower's blocks."""
    return vision["embed_dim"] if arch == "qwen2_vl" else vision["hidden_size"]


def text_config(arch, vision):
    """A deliberately small text config: only a handful of its tensors are written."""
    width = vision_out_width(arch, vision)
    cfg = {
        "hidden_size": width, "intermediate_size": 2 * width, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 64,
        "rms_norm_eps": 1e-6, "max_position_embeddings": 32768, "hidden_act": "silu",
    }
    if arch == "qwen3_vl":
        cfg.update({"model_type": "qwen3_vl_text", "head_dim": width // 2,
                    "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20],
                                     "rope_type": "default"},
                    "rope_theta": 5000000})
    else:
        cfg.update({"rope_theta": 1000000.0,
                    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}})
    return cfg


def config_json(arch, vision, dtype):
    text = text_config(arch, vision)
    cfg = {
        "architectures": [_ARCHITECTURES[arch]],
        "model_type": arch,
        "torch_dtype": _TORCH_DTYPE_NAME[dtype],
        "image_token_id": 151655,
        "video_token_id": 151656,
        "vision_start_token_id": 151652,
        "vision_end_token_id": 151653,
        "vision_config": vision,
    }
    if arch == "qwen3_vl":
        cfg["text_config"] = text
        cfg["tie_word_embeddings"] = False
    else:
        # The Qwen2 family's published config.json keeps the text fields at
        # the top level.
        for k, v in text.items():
            cfg.setdefault(k, v)
        cfg["vision_config"]["model_type"] = arch
    return cfg


# preprocessor_config.json fields a size sets differently from the model's
# published processor (see --size).
_PROCESSOR_OVERRIDES = {
    ("qwen2_5_vl", "default"): {"max_pixels": 1003520,
                                "size": {"longest_edge": 1003520, "shortest_edge": 3136}},
}


def preprocessor_config_json(arch, vision, size="tiny"):
    """As Qwen2VLImageProcessor (Qwen2/2.5) or Qwen3-VL's processor writes it."""
    base = {
        "do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
        "rescale_factor": 1.0 / 255.0, "resample": 3,  # PIL.Image.BICUBIC
        "patch_size": vision["patch_size"], "temporal_patch_size": vision["temporal_patch_size"],
        "merge_size": vision["spatial_merge_size"],
    }
    if arch == "qwen3_vl":
        # Qwen3-VL-8B-Instruct: 65536..16777216 pixels, mean/std 0.5.
        base.update({
            "size": {"longest_edge": 16777216, "shortest_edge": 65536},
            "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
            "image_processor_type": "Qwen2VLImageProcessorFast", "processor_class": "Qwen3VLProcessor",
        })
    else:
        # Qwen2-VL / Qwen2.5-VL: 56*56 .. 28*28*16384 pixels, CLIP mean/std.
        base.update({
            "min_pixels": 3136, "max_pixels": 12845056,
            "size": {"longest_edge": 12845056, "shortest_edge": 3136},
            "image_mean": _CLIP_MEAN, "image_std": _CLIP_STD,
            "image_processor_type": "Qwen2VLImageProcessor",
            "processor_class": "Qwen2VLProcessor" if arch == "qwen2_vl" else "Qwen2_5_VLProcessor",
        })
    base.update(copy.deepcopy(_PROCESSOR_OVERRIDES.get((arch, size), {})))
    return base


# ---------------------------------------------------------------------------
# Tensor plan: (name, shape, kind) with kind in {linear_w, bias, norm_w, norm_b,
# conv_w, embed}; kind decides the initial distribution.

def _linear(prefix, n_out, n_in, bias=True):
    out = [(prefix + ".weight", (n_out, n_in), "linear_w")]
    if bias:
        out.append((prefix + ".bias", (n_out,), "bias"))
    return out


def _norm(prefix, n, bias):
    out = [(prefix + ".weight", (n,), "norm_w")]
    if bias:
        out.append((prefix + ".bias", (n,), "norm_b"))
    return out


def vision_tensors(arch, v):
    """The vision tower's tensors, without the checkpoint prefix."""
    d = vision_width(arch, v)
    c = v.get("in_chans", v.get("in_channels", 3))
    p, tps, m = v["patch_size"], v["temporal_patch_size"], v["spatial_merge_size"]
    merged = d * m * m
    out_w = vision_out_width(arch, v)
    t = [("patch_embed.proj.weight", (d, c, tps, p, p), "conv_w")]
    if arch == "qwen3_vl":
        t.append(("patch_embed.proj.bias", (d,), "bias"))
        t.append(("pos_embed.weight", (v["num_position_embeddings"], d), "embed"))
    for i in range(v["depth"]):
        b = f"blocks.{i}."
        layer_norm = arch != "qwen2_5_vl"
        t += _norm(b + "norm1", d, layer_norm) + _norm(b + "norm2", d, layer_norm)
        t += _linear(b + "attn.qkv", 3 * d, d) + _linear(b + "attn.proj", d, d)
        if arch == "qwen2_vl":
            hidden = int(d * v["mlp_ratio"])
            t += _linear(b + "mlp.fc1", hidden, d) + _linear(b + "mlp.fc2", d, hidden)
        elif arch == "qwen2_5_vl":
            hidden = v["intermediate_size"]
            t += _linear(b + "mlp.gate_proj", hidden, d) + _linear(b + "mlp.up_proj", hidden, d)
            t += _linear(b + "mlp.down_proj", d, hidden)
        else:
            hidden = v["intermediate_size"]
            t += _linear(b + "mlp.linear_fc1", hidden, d) + _linear(b + "mlp.linear_fc2", d, hidden)
    if arch == "qwen3_vl":
        t += _norm("merger.norm", d, True)
        t += _linear("merger.linear_fc1", merged, merged) + _linear("merger.linear_fc2", out_w, merged)
        for j in range(len(v["deepstack_visual_indexes"])):
            b = f"deepstack_merger_list.{j}."
            t += _norm(b + "norm", merged, True)
            t += _linear(b + "linear_fc1", merged, merged) + _linear(b + "linear_fc2", out_w, merged)
    else:
        t += _norm("merger.ln_q", d, arch == "qwen2_vl")
        t += _linear("merger.mlp.0", merged, merged) + _linear("merger.mlp.2", out_w, merged)
    return t


def language_tensors(arch, text):
    """A few language-model tensors a vision loader must skip (not a usable LM)."""
    h, vocab, inter = text["hidden_size"], text["vocab_size"], text["intermediate_size"]
    base = "model.language_model." if arch == "qwen3_vl" else "model."
    l0 = base + "layers.0."
    t = [(base + "embed_tokens.weight", (vocab, h), "embed")]
    t += _norm(l0 + "input_layernorm", h, False) + _norm(l0 + "post_attention_layernorm", h, False)
    qkv_bias = arch != "qwen3_vl"
    for proj in ("q_proj", "k_proj", "v_proj"):
        t += _linear(l0 + "self_attn." + proj, h, h, bias=qkv_bias)
    t += _linear(l0 + "self_attn.o_proj", h, h, bias=False)
    t += _linear(l0 + "mlp.gate_proj", inter, h, bias=False) + _linear(l0 + "mlp.up_proj", inter, h, bias=False)
    t += _linear(l0 + "mlp.down_proj", h, inter, bias=False)
    t += _norm(base + "norm", h, False)
    t.append(("lm_head.weight", (vocab, h), "linear_w"))
    return t


def all_tensors(arch, vision, text):
    prefix = "model.visual." if arch == "qwen3_vl" else "visual."
    tensors = [(prefix + n, s, k) for n, s, k in vision_tensors(arch, vision)]
    tensors += language_tensors(arch, text)
    return sorted(tensors, key=lambda x: x[0])


def draw(rng, shape, kind):
    """float32 values for one tensor, drawn from rng (see the module docstring)."""
    n = int(np.prod(shape))
    if kind in ("linear_w", "conv_w"):
        fan_in = int(np.prod(shape[1:]))
        scale, base = 1.0 / math.sqrt(fan_in), 0.0
    elif kind == "norm_w":
        scale, base = 0.1, 1.0
    elif kind == "embed":
        scale, base = 0.5, 0.0
    else:  # bias, norm_b
        scale, base = 0.1, 0.0
    # Drawn in chunks so the 7b size never holds a tensor's float64 draw at once.
    out = np.empty(n, dtype=np.float32)
    chunk = 1 << 22
    for s in range(0, n, chunk):
        e = min(n, s + chunk)
        out[s:e] = rng.standard_normal(e - s) * scale + base
    return out.reshape(shape)


def encode(values, dtype):
    """Little-endian bytes of float32 `values` in `dtype`."""
    if dtype == "f32":
        return values.astype("<f4").tobytes()
    if dtype == "f16":
        return values.astype("<f2").tobytes()
    # bf16: round float32 to nearest even on the upper 16 bits (values here are finite).
    bits = values.astype("<f4").view("<u4").astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype("<u2").tobytes()


def write_safetensors(path, entries, dtype, metadata, rng):
    """Writes one safetensors file of `entries` [(name, shape, kind)], drawing each
    tensor's values from rng as it goes.

    Layout (https://github.com/huggingface/safetensors, "Format"): 8-byte
    little-endian header length N, N bytes of JSON {name: {dtype, shape,
    data_offsets: [begin, end)}, "__metadata__": {str: str}} padded with spaces
    to a multiple of 8, then the raw little-endian tensor bytes; offsets count
    from the first byte after the header.
    """
    header = {"__metadata__": metadata}
    offset = 0
    for name, shape, _ in entries:
        nbytes = int(np.prod(shape)) * _ITEMSIZE[dtype]
        header[name] = {"dtype": _ST_DTYPE[dtype], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":"), sort_keys=True).encode("utf-8")
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name, shape, kind in entries:
            f.write(encode(draw(rng, shape, kind), dtype))
    return offset


def split_shards(tensors, n_shards, dtype):
    """Cuts the sorted tensor list into n_shards consecutive, non-empty runs of
    roughly equal byte size."""
    sizes = [int(np.prod(s)) * _ITEMSIZE[dtype] for _, s, _ in tensors]
    total = sum(sizes)
    shards, current, acc = [], [], 0
    for i, (t, size) in enumerate(zip(tensors, sizes)):
        current.append(t)
        acc += size
        left_tensors = len(tensors) - i - 1
        left_shards = n_shards - len(shards) - 1
        if left_shards > 0 and (acc >= total * (len(shards) + 1) / n_shards or left_tensors == left_shards):
            shards.append(current)
            current = []
    shards.append(current)
    return shards


def build(arch, out_dir, seed=0, dtype="f32", shards=1, size="tiny", config_from=None):
    if arch not in ARCHS:
        raise ValueError(f"unknown --arch {arch!r}; expected one of {', '.join(ARCHS)}")
    if (arch, size) not in _VISION:
        sizes = sorted(s for a, s in _VISION if a == arch)
        raise ValueError(f"--size {size} does not exist for --arch {arch}; expected one of {', '.join(sizes)}")
    vision = copy.deepcopy(_VISION[(arch, size)])
    if config_from:
        with open(config_from) as f:
            loaded = json.load(f)
        vision.update(loaded.get("vision_config", loaded))
    text = text_config(arch, vision)
    tensors = all_tensors(arch, vision, text)
    if not 1 <= shards <= len(tensors):
        raise ValueError(f"--shards must be between 1 and {len(tensors)}")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config_json(arch, vision, dtype), f, indent=2, sort_keys=True)
        f.write("\n")
    with open(os.path.join(out_dir, "preprocessor_config.json"), "w") as f:
        json.dump(preprocessor_config_json(arch, vision, size), f, indent=2, sort_keys=True)
        f.write("\n")
    # Remove files a previous run with another --shards left behind.
    for name in os.listdir(out_dir):
        if name.startswith("model") and (name.endswith(".safetensors") or name.endswith(".index.json")):
            os.remove(os.path.join(out_dir, name))
    rng = np.random.RandomState(seed)
    metadata = {"format": "pt"}
    if shards == 1:
        write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors, dtype, metadata, rng)
    else:
        weight_map, total = {}, 0
        for i, part in enumerate(split_shards(tensors, shards, dtype)):
            fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            total += write_safetensors(os.path.join(out_dir, fname), part, dtype, metadata, rng)
            for name, _, _ in part:
                weight_map[name] = fname
        with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2, sort_keys=True)
            f.write("\n")
    return vision


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", required=True, choices=ARCHS)
    ap.add_argument("--out", required=True, help="checkpoint directory to write (created if absent)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="f32", choices=sorted(_ST_DTYPE))
    ap.add_argument("--shards", type=int, default=1, help="number of safetensors shards (1: model.safetensors)")
    ap.add_argument("--size", default="tiny", choices=("tiny", "default", "7b"),
                    help="tiny: test sizes; default: epd-encode's default model (qwen2_5_vl only); "
                         "7b: the published 7B/8B vision_config")
    ap.add_argument("--config-from", help="config.json whose vision_config overrides the size's fields")
    args = ap.parse_args(argv)
    try:
        vision = build(args.arch, args.out, args.seed, args.dtype, args.shards, args.size, args.config_from)
    except (ValueError, OSError) as e:
        print(f"make_tiny_checkpoint.py: {e}", file=sys.stderr)
        return 1
    n_params = sum(int(np.prod(s)) for _, s, _ in vision_tensors(args.arch, vision))
    print(f"{args.out}: {args.arch} {args.size}, {vision['depth']} blocks, width {vision_width(args.arch, vision)}, "
          f"{vision['num_heads']} heads, out {vision_out_width(args.arch, vision)}, "
          f"{n_params} vision parameters, {args.dtype}, {args.shards} shard(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
