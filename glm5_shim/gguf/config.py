"""GGUF `glm-dsa` metadata → a Hugging Face `glm_moe_dsa` config dict, checked against the tensor shapes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from glm5_shim.names import GGUF_ARCH, HF_ARCHITECTURE, HF_MODEL_TYPE

from .errors import GGUFError
from .reader import GGUFModel

MODEL_TYPE = HF_MODEL_TYPE
ARCHITECTURES = [HF_ARCHITECTURE]

# llama.cpp's expert_gating_func enum.
_GATING_FUNCS = {1: "softmax", 2: "sigmoid"}

# GLM-5.2 runs the DSA indexer only in "full" layers; a "shared" layer reuses the previous full layer's top-k and has
# no indexer weights.  llama.cpp's converter writes one bool per trunk layer (true = full) under this key.
INDEXER_TYPES_KEY = "attention.indexer.types"
# Without the key llama.cpp (src/models/glm-dsa.cpp) takes a context of 2**20 tokens or more to mean GLM-5.2's layout,
# anything shorter all full (GLM-5, 5.1).
GLM52_CONTEXT = 1 << 20


def glm52_layer_is_full(layer: int) -> bool:
    """GLM-5.2's layout: layers 0 and 1 full, then groups of four from layer 2: full, shared, shared, shared."""
    return layer < 2 or (layer - 2) % 4 == 0


@dataclass(frozen=True)
class IndexerLayout:
    """Which trunk layers run their own DSA indexer (the MTP block always does), and how that was decided."""
    full: tuple[bool, ...]
    source: str

    @property
    def pattern(self) -> str:
        """vLLM's IndexCache pattern (config.index_topk_pattern): F = full, S = shared (skips its top-k)."""
        return "".join("F" if f else "S" for f in self.full)

    @property
    def shared_layers(self) -> list[int]:
        return [i for i, f in enumerate(self.full) if not f]

    def describe(self) -> str:
        n_full = sum(self.full)
        if n_full == len(self.full):
            return f"all {n_full} layers full ({self.source})"
        return (f"{' '.join(self.pattern)} ({n_full} full, {len(self.full) - n_full} shared reuse the previous full "
                f"layer's top-k; {self.source})")


def layer_shares_topk(config: dict[str, Any], layer: int) -> bool:
    """A trunk layer that reuses the previous full layer's top-k (config indexer_types, as build_hf_config writes it
    and GLM-5.2's checkpoint lists it); the MTP block and every layer of a GLM-5 / 5.1 config run their own indexer."""
    types = config.get("indexer_types")
    return bool(types) and 0 <= layer < len(types) and types[layer] == "shared"


def indexer_layout(model: GGUFModel, num_hidden_layers: int | None = None) -> IndexerLayout:
    """The file's indexer layout: its glm-dsa.attention.indexer.types key, or llama.cpp's rule without it."""
    md = _Metadata(model)
    if num_hidden_layers is None:
        num_hidden_layers = md.int("block_count", minimum=1) - md.int("nextn_predict_layers", 0)
    key = md.key(INDEXER_TYPES_KEY)
    if key in model.metadata:
        value = model.metadata[key]
        if isinstance(value, (bool, int)):  # llama.cpp also takes one value for every layer
            value = [value] * num_hidden_layers
        if not isinstance(value, list) or not all(isinstance(v, (bool, int)) and v in (0, 1) for v in value):
            raise md._fail(key, "an array of bools (true = full indexer, false = shared)", value)
        if len(value) != num_hidden_layers:
            raise md._fail(key, f"{num_hidden_layers} entries (one per trunk layer: block_count - "
                                f"nextn_predict_layers)", f"{len(value)} entries")
        full = tuple(bool(v) for v in value)
        source = f"from {key}"
    else:
        context = md.int("context_length", 0)
        if context >= GLM52_CONTEXT:
            full = tuple(glm52_layer_is_full(i) for i in range(num_hidden_layers))
            source = (f"{key} absent, context_length {context} >= {GLM52_CONTEXT}: GLM-5.2's layout, "
                      f"as llama.cpp assumes")
        else:
            full = (True,) * num_hidden_layers
            source = f"{key} absent, context_length {context} < {GLM52_CONTEXT}: all full, as llama.cpp assumes"
    if full and not full[0]:
        raise md._fail(key, "layer 0 full (a shared layer reuses an earlier full layer's top-k)", "layer 0 shared")
    return IndexerLayout(full, source)


def _float32_value(value: float) -> float:
    """GGUF stores these as float32; give back the shortest decimal (1e-05, not 9.99999974738e-06)."""
    return float(str(np.float32(value)))


class _Metadata:
    """Typed access to `<arch>.*` keys with one-line errors naming the file and key."""

    def __init__(self, model: GGUFModel):
        self.model = model
        self.arch = model.architecture

    def key(self, suffix: str) -> str:
        return f"{self.arch}.{suffix}"

    def _fail(self, key: str, expected: str, found: Any) -> GGUFError:
        return GGUFError(f"{self.model.path}: metadata key {key}: expected {expected}, found {found!r}")

    def int(self, suffix: str, default: int | None = None, *, minimum: int = 0) -> int:
        key = self.key(suffix)
        if key not in self.model.metadata:
            if default is None:
                raise GGUFError(f"{self.model.path}: metadata key {key} is missing (expected an integer)")
            return default
        value = self.model.metadata[key]
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._fail(key, "an integer", value)
        if value < minimum:
            raise self._fail(key, f"an integer >= {minimum}", value)
        return value

    def float(self, suffix: str, default: float | None = None) -> float:
        key = self.key(suffix)
        if key not in self.model.metadata:
            if default is None:
                raise GGUFError(f"{self.model.path}: metadata key {key} is missing (expected a number)")
            return default
        value = self.model.metadata[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._fail(key, "a number", value)
        return _float32_value(value)

    def bool(self, suffix: str, default: bool) -> bool:
        key = self.key(suffix)
        value = self.model.metadata.get(key, default)
        if not isinstance(value, bool):
            raise self._fail(key, "a bool", value)
        return value


def build_hf_config(model: GGUFModel, *, check_shapes: bool = True) -> dict[str, Any]:
    """The HF `config.json` dict for a glm-dsa GGUF (every field vLLM's deepseek_v2.py reads).

    With check_shapes, raises GGUFError on the first metadata value that contradicts a tensor shape.
    """
    if model.architecture != GGUF_ARCH:
        raise GGUFError(f"{model.path}: metadata key general.architecture is {model.architecture!r}, "
                        f"expected {GGUF_ARCH!r}")
    md = _Metadata(model)
    block_count = md.int("block_count", minimum=1)
    nextn = md.int("nextn_predict_layers", 0)
    if nextn >= block_count:
        raise GGUFError(f"{model.path}: metadata key {md.key('nextn_predict_layers')} is {nextn}, expected fewer "
                        f"than {md.key('block_count')} ({block_count})")
    num_hidden_layers = block_count - nextn

    heads = md.int("attention.head_count", minimum=1)
    rope_dim = md.int("rope.dimension_count", minimum=1)
    # key_length_mla is the per-head q/k size; older deepseek2-style files only have key_length.
    if md.key("attention.key_length_mla") in model.metadata:
        qk_head_dim = md.int("attention.key_length_mla", minimum=1)
        v_head_dim = md.int("attention.value_length_mla", minimum=1)
    else:
        qk_head_dim = md.int("attention.key_length", minimum=1)
        v_head_dim = md.int("attention.value_length", minimum=1)
    if qk_head_dim <= rope_dim:
        raise GGUFError(f"{model.path}: metadata key {md.key('attention.key_length_mla')} is {qk_head_dim}, expected "
                        f"more than {md.key('rope.dimension_count')} ({rope_dim})")

    gating_id = md.int("expert_gating_func", 2)
    if gating_id not in _GATING_FUNCS:
        raise GGUFError(f"{model.path}: metadata key {md.key('expert_gating_func')}: expected 1 (softmax) or "
                        f"2 (sigmoid), found {gating_id}")

    tokens = model.metadata.get("tokenizer.ggml.tokens")
    vocab_default = len(tokens) if isinstance(tokens, list) and tokens else None
    vocab_size = md.int("vocab_size", vocab_default, minimum=1)
    rope_theta = md.float("rope.freq_base", 10000.0)
    rope_theta = int(rope_theta) if float(rope_theta).is_integer() else rope_theta

    config: dict[str, Any] = {
        "architectures": list(ARCHITECTURES),
        "model_type": MODEL_TYPE,
        "dtype": "bfloat16",
        "torch_dtype": "bfloat16",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "hidden_size": md.int("embedding_length", minimum=1),
        "intermediate_size": md.int("feed_forward_length", minimum=1),
        "moe_intermediate_size": md.int("expert_feed_forward_length", minimum=1),
        "num_hidden_layers": num_hidden_layers,
        "num_nextn_predict_layers": nextn,
        "first_k_dense_replace": md.int("leading_dense_block_count", 0),
        "moe_layer_freq": 1,
        "num_attention_heads": heads,
        # MLA: vLLM wants the real head count here; GGUF's head_count_kv=1 is llama.cpp's MQA view.
        "num_key_value_heads": heads,
        "q_lora_rank": md.int("attention.q_lora_rank", minimum=1),
        "kv_lora_rank": md.int("attention.kv_lora_rank", minimum=1),
        "qk_nope_head_dim": qk_head_dim - rope_dim,
        "qk_rope_head_dim": rope_dim,
        "qk_head_dim": qk_head_dim,
        "v_head_dim": v_head_dim,
        "head_dim": rope_dim,
        "index_n_heads": md.int("attention.indexer.head_count", minimum=1),
        "index_head_dim": md.int("attention.indexer.key_length", minimum=1),
        "index_topk": md.int("attention.indexer.top_k", minimum=1),
        "indexer_rope_interleave": True,
        "rope_interleave": True,
        "n_routed_experts": md.int("expert_count", minimum=1),
        "n_shared_experts": md.int("expert_shared_count", 0),
        "num_experts_per_tok": md.int("expert_used_count", minimum=1),
        "n_group": md.int("expert_group_count", 1, minimum=1),
        "topk_group": md.int("expert_group_used_count", 1, minimum=1),
        "topk_method": "noaux_tc",
        "scoring_func": _GATING_FUNCS[gating_id],
        "norm_topk_prob": md.bool("expert_weights_norm", False),
        "routed_scaling_factor": md.float("expert_weights_scale", 1.0),
        "rms_norm_eps": md.float("attention.layer_norm_rms_epsilon"),
        "rope_parameters": {"rope_theta": rope_theta, "rope_type": "default"},
        "rope_theta": rope_theta,
        "rope_scaling": None,
        "max_position_embeddings": md.int("context_length", minimum=1),
        "vocab_size": vocab_size,
        "tie_word_embeddings": "output.weight" not in model.tensors,
        "ep_size": 1,
        "pretraining_tp": 1,
        "initializer_range": 0.02,
        "use_cache": True,
    }
    if config["num_experts_per_tok"] > config["n_routed_experts"]:
        raise GGUFError(f"{model.path}: metadata key {md.key('expert_used_count')} is "
                        f"{config['num_experts_per_tok']}, expected at most {md.key('expert_count')} "
                        f"({config['n_routed_experts']})")
    layout = indexer_layout(model, num_hidden_layers)
    if not all(layout.full):
        # transformers' GlmMoeDsaConfig reads indexer_types; vLLM 0.23's deepseek_v2 reads index_topk_pattern.
        config["indexer_types"] = ["full" if f else "shared" for f in layout.full]
        config["index_topk_pattern"] = layout.pattern
    config.update(_special_token_ids(model))
    if check_shapes:
        problems = config_shape_problems(model, config)
        if problems:
            raise GGUFError(problems[0])
    return config


def _special_token_ids(model: GGUFModel) -> dict[str, Any]:
    meta = model.metadata
    out: dict[str, Any] = {}
    for key in ("bos", "eos", "eot", "eom", "padding"):
        full = f"tokenizer.ggml.{key}_token_id"
        if full in meta and (isinstance(meta[full], bool) or not isinstance(meta[full], int)):
            raise GGUFError(f"{model.path}: metadata key {full}: expected an integer token id, found {meta[full]!r}")
    if "tokenizer.ggml.bos_token_id" in meta:
        out["bos_token_id"] = meta["tokenizer.ggml.bos_token_id"]
    eos_ids = []
    for key in ("eos", "eot", "eom"):
        value = meta.get(f"tokenizer.ggml.{key}_token_id")
        if value is not None and value not in eos_ids:
            eos_ids.append(value)
    if eos_ids:
        out["eos_token_id"] = eos_ids if len(eos_ids) > 1 else eos_ids[0]
    if "tokenizer.ggml.padding_token_id" in meta:
        out["pad_token_id"] = meta["tokenizer.ggml.padding_token_id"]
    return out


def mtp_block_absent(model: GGUFModel, config: dict[str, Any]) -> bool:
    """nextn_predict_layers > 0 but no tensor of the MTP block in the file: what llama.cpp loads as a "trunk-only"
    file (MTP tensors optional when blk.{n_layer}.nextn.eh_proj.weight is absent)."""
    n_layers, n_mtp = config["num_hidden_layers"], config["num_nextn_predict_layers"]
    prefixes = tuple(f"blk.{layer}." for layer in range(n_layers, n_layers + n_mtp))
    return n_mtp > 0 and not any(name.startswith(prefixes) for name in model.tensors)


def _trunk_without_mtp_block(model: GGUFModel, config: dict[str, Any]) -> bool:
    """A trunk-only file whose trunk is whole up to its last block (block_count then counts a block that is absent)."""
    last_trunk = f"blk.{config['num_hidden_layers'] - 1}.attn_norm.weight"
    return last_trunk in model.tensors and mtp_block_absent(model, config)


def config_shape_problems(model: GGUFModel, config: dict[str, Any]) -> list[str]:
    """One-line messages for every metadata value that a tensor shape contradicts.

    Each check names the metadata key(s) and the tensor. Only tensors that exist are checked; missing
    tensors are the validator's business.
    """
    arch = model.architecture
    path = model.path
    c = config
    heads, rope, kv_lora = c["num_attention_heads"], c["qk_rope_head_dim"], c["kv_lora_rank"]
    problems: list[str] = []

    def check(tensor: str, axis: int, expected: int, keys: str) -> None:
        info = model.tensors.get(tensor)
        if info is None or axis >= len(info.shape) or -axis > len(info.shape):
            return
        found = info.shape[axis]
        if found != expected:
            problems.append(f"{path}: metadata {keys} = {expected} contradicts tensor {tensor} "
                            f"(shape {list(info.shape)}, dim {axis} is {found})")

    k = lambda *suffixes: " / ".join(f"{arch}.{s}" for s in suffixes)  # noqa: E731
    hidden = c["hidden_size"]
    check("token_embd.weight", -1, hidden, k("embedding_length"))
    check("token_embd.weight", 0, c["vocab_size"], k("vocab_size"))
    check("output.weight", 0, c["vocab_size"], k("vocab_size"))

    first_moe = c["first_k_dense_replace"]
    check("blk.0.attn_q_a.weight", 0, c["q_lora_rank"], k("attention.q_lora_rank"))
    check("blk.0.attn_q_a.weight", 1, hidden, k("embedding_length"))
    check("blk.0.attn_q_b.weight", 0, heads * c["qk_head_dim"],
          k("attention.head_count", "attention.key_length_mla"))
    check("blk.0.attn_kv_a_mqa.weight", 0, kv_lora + rope, k("attention.kv_lora_rank", "rope.dimension_count"))
    check("blk.0.attn_k_b.weight", 0, heads, k("attention.head_count"))
    check("blk.0.attn_k_b.weight", 1, kv_lora, k("attention.kv_lora_rank"))
    check("blk.0.attn_k_b.weight", 2, c["qk_nope_head_dim"], k("attention.key_length_mla", "rope.dimension_count"))
    check("blk.0.attn_v_b.weight", 1, c["v_head_dim"], k("attention.value_length_mla"))
    check("blk.0.attn_kv_b.weight", 0, heads * (c["qk_nope_head_dim"] + c["v_head_dim"]),
          k("attention.head_count", "attention.key_length_mla", "attention.value_length_mla"))
    check("blk.0.attn_output.weight", 1, heads * c["v_head_dim"],
          k("attention.head_count", "attention.value_length_mla"))
    check("blk.0.indexer.attn_q_b.weight", 0, c["index_n_heads"] * c["index_head_dim"],
          k("attention.indexer.head_count", "attention.indexer.key_length"))
    check("blk.0.indexer.attn_k.weight", 0, c["index_head_dim"], k("attention.indexer.key_length"))
    check("blk.0.indexer.proj.weight", 0, c["index_n_heads"], k("attention.indexer.head_count"))
    if first_moe > 0:
        check("blk.0.ffn_gate.weight", 0, c["intermediate_size"], k("feed_forward_length"))
    moe = f"blk.{first_moe}"
    check(f"{moe}.ffn_gate_inp.weight", 0, c["n_routed_experts"], k("expert_count"))
    check(f"{moe}.ffn_gate_exps.weight", 0, c["n_routed_experts"], k("expert_count"))
    check(f"{moe}.ffn_gate_exps.weight", 1, c["moe_intermediate_size"], k("expert_feed_forward_length"))
    check(f"{moe}.ffn_gate_shexp.weight", 0, c["moe_intermediate_size"] * c["n_shared_experts"],
          k("expert_feed_forward_length", "expert_shared_count"))

    # Layer structure: block_count and leading_dense_block_count against which blocks exist.
    n_blocks = c["num_hidden_layers"] + c["num_nextn_predict_layers"]
    last = f"blk.{n_blocks - 1}.attn_norm.weight"
    beyond = f"blk.{n_blocks}.attn_norm.weight"
    if model.tensors and last not in model.tensors and not _trunk_without_mtp_block(model, c):
        problems.append(f"{path}: metadata {arch}.block_count = {n_blocks} contradicts the tensors: {last} is missing")
    if beyond in model.tensors:
        problems.append(f"{path}: metadata {arch}.block_count = {n_blocks} contradicts tensor {beyond}, "
                        f"which belongs to block {n_blocks}")
    if first_moe > 0 and f"blk.{first_moe - 1}.ffn_gate_exps.weight" in model.tensors:
        problems.append(f"{path}: metadata {arch}.leading_dense_block_count = {first_moe} contradicts tensor "
                        f"blk.{first_moe - 1}.ffn_gate_exps.weight (a MoE tensor in a dense block)")
    if first_moe < c["num_hidden_layers"] and f"blk.{first_moe}.ffn_gate.weight" in model.tensors:
        problems.append(f"{path}: metadata {arch}.leading_dense_block_count = {first_moe} contradicts tensor "
                        f"blk.{first_moe}.ffn_gate.weight (a dense-FFN tensor in a MoE block)")

    tokens = model.metadata.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list) and tokens and len(tokens) > c["vocab_size"]:
        problems.append(f"{path}: metadata {arch}.vocab_size = {c['vocab_size']} is smaller than "
                        f"tokenizer.ggml.tokens ({len(tokens)} tokens)")
    return problems
