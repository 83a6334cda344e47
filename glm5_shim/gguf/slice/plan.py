"""What a GLM-5 slice holds: its HF config, and every tensor's name, shape, type and magnitude, in file order.

A slice is GLM-5 at its real sizes (fixture.model_config.GLM5_SIZES) with fewer layers: `layers` decoder layers, the
first `dense_layers` dense, then MoE, plus the MTP block blk.{layers} when asked.  Names and shapes are the
converter's (fixture.hf_to_gguf on fixture.model_config's checkpoint shapes), types those of the preset
(fixture.tensor_types.named_preset_types: llama-quantize's own presets on the slice's converted file, or an override
preset such as UD-IQ2_M-like).

rank_of=N: the model ONE rank computes at tensor-parallel size N in vLLM 0.23 (vllm/model_executor/models/
deepseek_v2.py, deepseek_mtp.py), as a file that runs at TP 1:
  divided by N   attention heads (q_b_proj, kv_b_proj = attn_k_b + attn_v_b: ColumnParallelLinear; o_proj:
                 RowParallelLinear), the dense MLP's and the shared expert's width (DeepseekV2MLP: merged gate/up
                 column-, down row-parallel), every routed expert's width (FusedMoE without expert parallelism:
                 intermediate_size_per_partition), the vocabulary (VocabParallelEmbedding, ParallelLMHead)
  kept whole     hidden size, q_a_proj + kv_a_proj_with_mqa (DeepSeekV2FusedQkvAProjLinear, disable_tp=True), the
                 q_a / kv_a norms, the whole DSA indexer (wq_b ReplicatedLinear; wk + weights_proj a
                 MergedColumnParallelLinear with disable_tp=True; k_norm), the router and its bias (GateLinear),
                 the expert count, the MTP block's eh_proj (nn.Linear) and norms, every layer norm
Types are those of the whole model (a rank holds pieces of the whole model's tensors), and the random values have
the whole model's magnitude (row-parallel pieces sum over the ranks), so a rank's partial outputs are ~1/sqrt(N) of
the whole model's.  vLLM pads each rank's vocabulary to a multiple of 64 (154880 / 8 = 19360 → 19392 at TP 1 of the
slice; 19360 exactly at TP 8 of the whole model): the padding rows are never sampled.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from ..llama_tools import converter_order, fit_to_row, layer_of, quantize_order
from ..fixture.hf_to_gguf import _gguf_names_of, hf_to_gguf_shapes
from ..fixture.model_config import GLM5_SIZES, glm5_hf_config, hf_weight_shapes
from ..fixture.tensor_types import PRESETS, named_preset_types
from ..fixture.vocab import TinyTokenizer, padded_tokenizer, tiny_tokenizer
from .blocks import SUPPORTED_TYPES, block_geometry, tensor_nbytes

# What a rank of tensor parallelism divides (config keys); everything else is replicated.
RANK_DIVIDED = ("num_attention_heads", "num_key_value_heads", "intermediate_size", "moe_intermediate_size",
                "vocab_size")
ORDERS = ("auto", "converter", "quantize")
TOKENIZER_PRE = "glm4"


@dataclass(frozen=True)
class SliceTensor:
    name: str
    shape: tuple[int, ...]  # numpy order (GGUF ne reversed), as this file stores it
    type_name: str
    std: float  # standard deviation of the values (the whole model's)
    mean: float = 0.0  # float tensors only: norms are ~1
    pass_through: float = 0.0  # float [n, 2n] only, --peaked's eh_proj: this gain times [identity | 0], not random
    data_of: str = ""  # --shared-data: the tensor whose bytes this one's entry points at ("" = its own bytes)

    @property
    def n_values(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        if self.type_name in ("F32", "F16", "BF16"):
            return self.n_values * {"F32": 4, "F16": 2, "BF16": 2}[self.type_name]
        return tensor_nbytes(self.type_name, self.n_values)


# --peaked (a slice whose MTP layer drafts what the slice will say, for speculative decoding's speed where a step is
# GPU time): the token embedding's RMS and the MTP eh_proj's pass-through gain, against the ~0.5 RMS a random layer
# writes to the residual stream.  At 512 the trunk's final hidden state is its token's embedding within ~1 % over 78
# layers (in bf16 a layer's write mostly rounds away), so greedy decoding says f(t) = argmax lm_head . embed[t]
# after each token t; the MTP layer gets embed(t[p+1]), passes it through eh_proj's identity, and drafts
# f(t[p+1]) — the trunk's next choice.  The norms on both sides (output_norm, enorm, shared_head_norm) are exactly 1
# so that both compare the same direction.  Kernels and shapes are those of the random slice, and so are the bytes but
# eh_proj's (F16: 151 MB against Q4_K_M's 42 MB; vLLM makes it a float Linear either way).  Not yet run on
# a GPU; a float simulation of the argument (Gaussian embedding at this RMS and lm_head at the slice's, the trunk's
# writes as noise of RMS 5 / 20 / 60, the MTP block's 1 / 4 / 10, bf16 rounding; 400 tokens of the rank-of-8
# vocabulary) gives the trunk's choice as the draft 98.5 / 89 / 74 % of the time.
PEAKED_GAIN = 512.0
PEAKED_UNIT_NORMS = ("output_norm.weight", "nextn.enorm.weight", "nextn.shared_head_norm.weight")
PEAKED_EH_PROJ_TYPE = "F16"


@dataclass(frozen=True)
class SlicePlan:
    config: dict[str, Any]  # the file's HF config (per-rank sizes when rank_of > 1)
    full_config: dict[str, Any]  # the same slice at full width
    tokenizer: TinyTokenizer  # padded to the file's vocab_size
    tensors: list[SliceTensor]  # file order
    preset: str
    rank_of: int
    order: str  # the order actually used ("converter" or "quantize")
    peaked: bool = False
    shared_data: bool = False

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data a loader reads (and a GPU holds): every tensor's, shared or not."""
        return sum(t.nbytes for t in self.tensors)

    @property
    def file_data_nbytes(self) -> int:
        """Bytes of tensor data written to the file (unpadded): the tensors that own their bytes."""
        return sum(t.nbytes for t in self.tensors if not t.data_of)

    @property
    def distinct_layers(self) -> list[int]:
        """The decoder layers (MTP included) whose tensors own their bytes."""
        return sorted({layer for t in self.tensors if not t.data_of and (layer := layer_of(t.name)) is not None})


def share_layer_data(tensors: list[SliceTensor], mtp_layer: int | None) -> list[SliceTensor]:
    """--shared-data: each decoder layer whose tensors have exactly the names (past `blk.N.`), types, shapes and
    magnitudes of an earlier layer's points its entries at that layer's bytes; the first layer of each such kind
    keeps its own.  A GLM-5 slice has few kinds — the dense layers, the MoE layers (split further where the preset
    gives some layers other types, as llama-quantize's Q4_K_M does), the MTP block (never shared: its tensors are
    its own) — so 78 layers are written as a handful.  A loader still makes one tensor of each entry, so the
    weights a step reads are the plain file's, at their full size; only the file is small."""
    by_layer: dict[int, list[SliceTensor]] = {}
    for t in tensors:
        layer = layer_of(t.name)
        if layer is not None:
            by_layer.setdefault(layer, []).append(t)
    first_of_kind: dict[tuple, int] = {}
    source: dict[int, int] = {}
    for layer in sorted(by_layer):
        if layer == mtp_layer:
            continue
        kind = tuple(sorted((t.name.split(".", 2)[2], t.type_name, t.shape, t.std, t.mean, t.pass_through)
                            for t in by_layer[layer]))
        source[layer] = first_of_kind.setdefault(kind, layer)
    out = []
    for t in tensors:
        layer = layer_of(t.name)
        if layer is not None and source.get(layer, layer) != layer:
            out.append(replace(t, data_of=f"blk.{source[layer]}.{t.name.split('.', 2)[2]}"))
        else:
            out.append(t)
    return out


def rank_config(config: dict[str, Any], rank_of: int) -> dict[str, Any]:
    """The config of what one of `rank_of` tensor-parallel ranks computes (RANK_DIVIDED divided)."""
    if rank_of < 1:
        raise ValueError(f"rank_of={rank_of}: expected a tensor-parallel size >= 1")
    out = dict(config)
    for key in RANK_DIVIDED:
        if config[key] % rank_of:
            raise ValueError(f"--rank-of {rank_of}: {key} {config[key]} is not divisible by {rank_of}")
        out[key] = config[key] // rank_of
    return out


def _gguf_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    return hf_to_gguf_shapes(hf_weight_shapes(config), config)


def _ordered_names(config: dict[str, Any], shapes: dict[str, tuple[int, ...]], order: str) -> list[str]:
    if order == "quantize":
        return quantize_order(shapes)
    return converter_order(hf_weight_shapes(config), config["n_routed_experts"],
                           lambda hf: _gguf_names_of(hf, shapes))


def _std_and_mean(name: str, full_shape: tuple[int, ...]) -> tuple[float, float]:
    """fixture.weights.random_hf_weights' magnitudes: norms 1 + 0.1 N(0,1), other 1-D tensors 0.1 N(0,1), matrices
    N(0,1) / sqrt(row length) of the HF weight (attn_k_b's HF row is kv_b_proj's, kv_lora)."""
    if len(full_shape) == 1:
        return 0.1, (1.0 if name.endswith("norm.weight") else 0.0)
    row = full_shape[-2] if name.endswith("attn_k_b.weight") else full_shape[-1]
    return 1.0 / math.sqrt(row), 0.0


def plan_slice(layers: int, dense_layers: int, preset: str, *, mtp: bool = False, rank_of: int = 1,
               order: str = "auto", peaked: bool = False, shared_data: bool = False) -> SlicePlan:
    """Every tensor of a GLM-5 slice: `layers` decoder layers (the first `dense_layers` dense), `preset` types
    (fixture.tensor_types.PRESETS), the MTP block when `mtp`, one tensor-parallel rank of `rank_of`; tensor order
    `order` (ORDERS: "auto" is llama-quantize's, the tool that writes preset files); `peaked` (needs `mtp`): the
    embedding, norms and eh_proj of PEAKED_GAIN's note, so that the MTP layer drafts the slice's greedy tokens;
    `shared_data`: layers of one kind share their bytes in the file (share_layer_data)."""
    if peaked and not mtp:
        raise ValueError("--peaked makes the MTP layer draft the slice's tokens: it needs --mtp")
    if layers < 1:
        raise ValueError(f"layers={layers}: expected at least 1")
    if preset not in PRESETS:
        raise ValueError(f"preset {preset!r}: expected one of {', '.join(PRESETS)}")
    if order not in ORDERS:
        raise ValueError(f"order {order!r}: expected one of {', '.join(ORDERS)}")
    order = "quantize" if order == "auto" else order
    full_tokenizer = padded_tokenizer(tiny_tokenizer(TOKENIZER_PRE), GLM5_SIZES["vocab_size"])
    full = glm5_hf_config(layers=layers, dense_layers=dense_layers, mtp=mtp, tokenizer=full_tokenizer)
    config = rank_config(full, rank_of)
    tokenizer = padded_tokenizer(tiny_tokenizer(TOKENIZER_PRE), config["vocab_size"])

    full_shapes = _gguf_shapes(full)
    shapes = _gguf_shapes(config)
    assert shapes.keys() == full_shapes.keys()
    types = named_preset_types(full_shapes, full, preset)
    tensors = []
    for name in _ordered_names(config, shapes, order):
        type_name = types[name]
        if type_name not in SUPPORTED_TYPES:
            raise ValueError(f"tensor {name}: type {type_name} has no random-block recipe")
        if fit_to_row(type_name, shapes[name][-1]) != type_name:
            block = block_geometry(type_name)[0]
            raise ValueError(f"--rank-of {rank_of}: tensor {name} keeps {type_name} (the whole model's type) but a "
                             f"rank's rows of {shapes[name][-1]} values are not whole blocks of {block}; vLLM "
                             f"refuses tensor-parallel size {rank_of} for such a file")
        std, mean = _std_and_mean(name, full_shapes[name])
        tensor = SliceTensor(name, shapes[name], type_name, std, mean)
        tensors.append(_peaked(tensor) if peaked else tensor)
    if shared_data:
        tensors = share_layer_data(tensors, layers if mtp else None)
    return SlicePlan(config, full, tokenizer, tensors, preset, rank_of, order, peaked, shared_data)


def _peaked(t: SliceTensor) -> SliceTensor:
    """A tensor of the --peaked slice (PEAKED_GAIN's note); the others as the random slice's."""
    if t.name == "token_embd.weight":
        return replace(t, std=PEAKED_GAIN)   # RMS 512 instead of 1 / sqrt(hidden)
    if t.name.endswith(PEAKED_UNIT_NORMS):
        return replace(t, std=0.0, mean=1.0)
    if t.name.endswith("nextn.eh_proj.weight"):
        n, two_n = t.shape
        if two_n != 2 * n:
            raise AssertionError(f"{t.name}: expected [n, 2 n], found {list(t.shape)}")
        return replace(t, type_name=PEAKED_EH_PROJ_TYPE, std=0.0, pass_through=PEAKED_GAIN)
    return t
