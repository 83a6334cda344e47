"""What llama.cpp's own tools write for a glm-dsa model: per-tensor types and tensor order.

Every GLM-5 GGUF a user downloads was written by two tools: ``convert_hf_to_gguf.py`` (F32, F16, BF16 or Q8_0
files) and then, for every other type, ``llama-quantize`` with a preset (Q4_K_M, Q2_K, ...).  The project's
generator imitates both so that tests see the layouts users have: the rules below are restated from the tools'
behaviour (llama.cpp as vendored in llama-cpp-python 0.3.36) and checked against the real tools by
tests/gguf/test_llama_tools_real.py.

Order: the converter walks the HF checkpoint's tensors in safetensors order (names sorted) and emits each one as it
comes, except the routed experts, which it stacks and emits (down, gate, up) when a layer's last expert arrives;
llama-quantize writes globals first, then block by block, names sorted within a block.  Either way
``attn_kv_a_mqa`` comes before ``attn_q_a``: the reverse of vLLM's fused shard order.
"""
from __future__ import annotations

import re
from typing import Callable, Iterable

import gguf

CONVERTER_OUTTYPES = ("F32", "F16", "BF16", "Q8_0")
# llama-quantize presets: name → the type most tensors get.
QUANTIZE_PRESETS = {
    "Q4_0": "Q4_0", "Q5_0": "Q5_0", "Q8_0": "Q8_0", "Q2_K": "Q2_K", "Q3_K_M": "Q3_K", "Q4_K_S": "Q4_K",
    "Q4_K_M": "Q4_K", "Q5_K_S": "Q5_K", "Q5_K_M": "Q5_K", "Q6_K": "Q6_K", "IQ4_XS": "IQ4_XS", "IQ4_NL": "IQ4_NL",
}
PRESET_FILE_TYPES = {
    "Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0, "Q5_0": gguf.LlamaFileType.MOSTLY_Q5_0,
    "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0, "Q2_K": gguf.LlamaFileType.MOSTLY_Q2_K,
    "Q3_K_M": gguf.LlamaFileType.MOSTLY_Q3_K_M, "Q4_K_S": gguf.LlamaFileType.MOSTLY_Q4_K_S,
    "Q4_K_M": gguf.LlamaFileType.MOSTLY_Q4_K_M, "Q5_K_S": gguf.LlamaFileType.MOSTLY_Q5_K_S,
    "Q5_K_M": gguf.LlamaFileType.MOSTLY_Q5_K_M, "Q6_K": gguf.LlamaFileType.MOSTLY_Q6_K,
    "IQ4_XS": gguf.LlamaFileType.MOSTLY_IQ4_XS, "IQ4_NL": gguf.LlamaFileType.MOSTLY_IQ4_NL,
}

# A row length that does not fit the chosen type's block falls back (llama-quantize); if the fallback does not fit
# either, F16.  In GLM-5 only attn_k_b (row = qk_nope_head_dim = 192) is affected.
BLOCK_FALLBACK = {"Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0",
                  "IQ4_XS": "IQ4_NL", "IQ2_XXS": "IQ4_NL", "IQ2_XS": "IQ4_NL", "IQ2_S": "IQ4_NL",
                  "IQ3_XXS": "IQ4_NL", "IQ3_S": "IQ4_NL", "IQ1_S": "IQ4_NL", "IQ1_M": "IQ4_NL"}

_BLOCK_RE = re.compile(r"blk\.(\d+)\.")


def block_size(type_name: str) -> int:
    return gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]][0]


def layer_of(gguf_name: str) -> int | None:
    m = _BLOCK_RE.match(gguf_name)
    return int(m.group(1)) if m else None


def _fits(type_name: str, row: int) -> bool:
    return row % block_size(type_name) == 0


def fit_to_row(type_name: str, row: int) -> str:
    """llama-quantize's fallback for a row length the type's blocks do not divide."""
    if _fits(type_name, row):
        return type_name
    fallback = BLOCK_FALLBACK.get(type_name, type_name)
    return fallback if _fits(fallback, row) else "F16"


# -- convert_hf_to_gguf.py ------------------------------------------------------------------------------------

def converter_keeps_f32(gguf_name: str, ndim: int) -> bool:
    """The converter keeps 1-D tensors, norms, the router, biases and the indexer's weights_proj in F32."""
    return (ndim <= 1 or gguf_name.endswith(("_norm.weight", "ffn_gate_inp.weight", "indexer.proj.weight"))
            or not gguf_name.endswith(".weight"))


def converter_type(gguf_name: str, shape: tuple[int, ...], outtype: str) -> str:
    """The type `convert_hf_to_gguf.py --outtype outtype` gives a tensor (shape in numpy order)."""
    if outtype not in CONVERTER_OUTTYPES:
        raise ValueError(f"outtype {outtype!r}: expected one of {', '.join(CONVERTER_OUTTYPES)}")
    if converter_keeps_f32(gguf_name, len(shape)):
        return "F32"
    if outtype == "Q8_0" and not _fits("Q8_0", shape[-1]):
        return "F16"
    return outtype


def converter_order(hf_names: Iterable[str], n_experts: int, emit: Callable[[str], list[str]]) -> list[str]:
    """GGUF names in the converter's order.  hf_names: the checkpoint's tensor names (the converter reads them in
    safetensors order, which is sorted); emit(hf_name) → the GGUF names that one HF tensor becomes (kv_b_proj → k_b,
    v_b); routed experts are held back per layer and written down, gate, up once all 3 × n_experts arrived."""
    out: list[str] = []
    pending: dict[int, int] = {}
    for name in sorted(hf_names):
        m = re.match(r"model\.layers\.(\d+)\.mlp\.experts\.\d+\.", name)
        if m is None:
            out.extend(emit(name))
            continue
        layer = int(m.group(1))
        pending[layer] = pending.get(layer, 0) + 1
        if pending[layer] == 3 * n_experts:
            out.extend(f"blk.{layer}.ffn_{proj}_exps.weight" for proj in ("down", "gate", "up"))
    return out


# -- llama-quantize -------------------------------------------------------------------------------------------

def quantize_order(gguf_names: Iterable[str]) -> list[str]:
    """llama-quantize writes globals first, then block by block; names sorted within each."""
    def key(name: str) -> tuple[int, str]:
        layer = layer_of(name)
        return (-1 if layer is None else layer, name)
    return sorted(gguf_names, key=key)


def quantize_allows(gguf_name: str, ndim: int) -> bool:
    """llama-quantize quantizes 2-D and 3-D `*weight` tensors except norms and the router (whatever their type in
    the input: the converter's F32 indexer.proj is quantized too)."""
    return (ndim >= 2 and gguf_name.endswith("weight") and "_norm.weight" not in gguf_name
            and "ffn_gate_inp.weight" not in gguf_name)


def _category(name: str) -> str:
    if name == "output.weight":
        return "output"
    if name == "token_embd.weight":
        return "token_embd"
    for needle, category in (("attn_qkv.weight", "attn_v"), ("attn_kv_b.weight", "attn_v"),
                             ("attn_v.weight", "attn_v"), ("attn_k.weight", "attn_k"), ("attn_q.weight", "attn_q"),
                             ("attn_output.weight", "attn_output"), ("ffn_up", "ffn_up"), ("ffn_gate", "ffn_gate"),
                             ("ffn_down", "ffn_down")):
        if needle in name:  # note: indexer.attn_k.weight is an "attn_k" to llama-quantize
            return category
    return "other"


def _more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def quantize_types(tensors: dict[str, tuple[str, tuple[int, ...]]], preset: str, *, n_layers_all: int,
                   n_experts: int, n_gqa: int) -> dict[str, str]:
    """The type `llama-quantize IN OUT preset` (no imatrix, no overrides) gives each tensor.

    tensors: GGUF name → (input type name, numpy-order shape), in any order; n_layers_all: block_count (MTP
    included); n_gqa: head_count / head_count_kv (glm-dsa writes head_count_kv 1).
    """
    if preset not in QUANTIZE_PRESETS:
        raise ValueError(f"preset {preset!r}: expected one of {', '.join(QUANTIZE_PRESETS)}")
    base = QUANTIZE_PRESETS[preset]
    tied = "output.weight" not in tensors
    n_attn_v = sum(1 for n in tensors if _category(n) == "attn_v")
    counters = {"attn_v": 0, "ffn_down": 0}
    out: dict[str, str] = {}
    for name in quantize_order(tensors):
        in_type, shape = tensors[name]
        if not quantize_allows(name, len(shape)):
            out[name] = in_type
            continue
        cat = _category(name)
        new = base
        layer = layer_of(name)
        if n_experts <= 1 and cat == "ffn_down":
            layer = counters["ffn_down"]
        if cat == "output" or (tied and cat == "token_embd"):
            new = "Q8_0" if not _fits(base, shape[-1]) else ("Q6_K" if base != "Q8_0" else base)
        elif cat == "token_embd":
            pass
        elif cat == "attn_v":
            i = counters["attn_v"]
            if preset == "Q2_K":
                new = "Q4_K" if n_gqa >= 4 else "Q3_K"
            elif preset == "Q3_K_M":
                new = "Q5_K" if i < 2 else "Q4_K"
            elif preset in ("IQ4_NL", "IQ4_XS") and n_gqa >= 4:
                new = "Q5_K"
            elif preset in ("Q4_K_M", "Q5_K_M") and _more_bits(i, n_attn_v):
                new = "Q6_K"
            elif preset == "Q4_K_S" and i < 4:
                new = "Q5_K"
            if n_experts == 8:
                new = "Q8_0"
            counters["attn_v"] += 1
        elif cat == "attn_k":
            if n_experts == 8:
                new = "Q8_0"
        elif cat == "ffn_down":
            n = n_layers_all
            if preset == "Q2_K":
                new = "Q3_K"
            elif preset == "Q3_K_M":
                new = "Q5_K" if layer < n // 16 else "Q4_K"
            elif preset in ("Q4_K_M", "Q5_K_M") and _more_bits(layer, n):
                new = "Q6_K"
            elif preset in ("IQ4_NL", "IQ4_XS") and layer < n // 8:
                new = "Q5_K"
            elif preset == "Q4_K_S" and layer < n // 8:
                new = "Q5_K"
            counters["ffn_down"] += 1
        elif cat == "attn_output":
            if n_experts == 8:
                if preset in ("Q2_K", "Q3_K_M", "IQ4_NL", "Q4_K_S", "Q4_K_M", "IQ4_XS"):
                    new = "Q5_K"
            elif preset == "Q2_K":
                new = "Q3_K"
            elif preset == "Q3_K_M":
                new = "Q4_K"
        out[name] = fit_to_row(new, shape[-1])
    return out
