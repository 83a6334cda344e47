"""Write tiny random GLM-5 (glm-dsa) GGUF models laid out the way llama.cpp's converter lays them out.

`make_tiny` keeps GLM-5's real MLA latent sizes (kv_lora 512, rope 64, nope 192, v 256, indexer head 128)
and shrinks everything else. Next to the GGUF it writes `<stem>.reference/` holding the float weights it
started from (HF names, per-expert, kv_b_proj unsplit, MTP block included), the HF config.json and the
trained tokenizer.json, so a reader can be checked against ground truth.

The HF → GGUF direction below is written independently of tensor_map.py (which maps GGUF → HF), so the
round-trip tests check one table against the other.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import gguf
import numpy as np

from ._tiny_corpus import TINY_CORPUS
from .kquants import quantize_q2_k, quantize_q3_k, quantize_q4_k, quantize_q5_k, quantize_q6_k
from glm5_shim.names import GGUF_ARCH, HF_ARCHITECTURE, HF_MODEL_TYPE

from .config import INDEXER_TYPES_KEY, glm52_layer_is_full, layer_shares_topk
from .kv_b import rebuild_kv_b, split_kv_b
from .llama_tools import CONVERTER_OUTTYPES, PRESET_FILE_TYPES, QUANTIZE_PRESETS, converter_keeps_f32, \
    converter_order, converter_type, fit_to_row, layer_of, quantize_order, quantize_types

ARCH = GGUF_ARCH
# quant: what every quantizable tensor becomes.  F32/F16/BF16/Q8_0 are convert_hf_to_gguf.py's --outtype (its
# per-tensor choices: indexer.proj, norms, router and biases stay F32); the others are "pure" files (like
# llama-quantize --pure).  A llama-quantize preset (preset=..., llama_tools.QUANTIZE_PRESETS) gives the mix the real
# tool writes instead.
QUANT_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q5_0", "Q4_K", "Q6_K")
# Tensor orders: what the real tools write ("converter": convert_hf_to_gguf.py, "quantize": llama-quantize), or the
# generator's historical order ("legacy": attn_q_a first, one block's tensors in the HF model's module order).
ORDERS = ("auto", "converter", "quantize", "legacy")
# The two files llama.cpp's converter writes when the trunk and the MTP draft head are published apart (split_mtp):
# "trunk" is `convert_hf_to_gguf.py --no-mtp` (block_count = num_hidden_layers, no nextn_predict_layers key, no MTP
# block), "mtp" is `--mtp` (the metadata of the whole model, but only token_embd, output_norm, output and the MTP
# block's tensors).  "stripped" is neither: the whole model's metadata (nextn_predict_layers > 0) without the MTP
# block's tensors, the file llama.cpp's loader calls "trunk-only" (no blk.{n_layer}.nextn.eh_proj.weight).
SPLIT_MTP = ("trunk", "mtp", "stripped")

FILE_TYPES = {
    "F32": gguf.LlamaFileType.ALL_F32, "F16": gguf.LlamaFileType.MOSTLY_F16,
    "BF16": gguf.LlamaFileType.MOSTLY_BF16, "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    "Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0, "Q5_0": gguf.LlamaFileType.MOSTLY_Q5_0,
    "Q4_K": gguf.LlamaFileType.MOSTLY_Q4_K_S, "Q6_K": gguf.LlamaFileType.MOSTLY_Q6_K,
}

GLM_SPECIAL_TOKENS = ("<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>",
                      "<|user|>", "<|assistant|>", "<|observation|>", "<think>", "</think>")
BPE_VOCAB_SIZE = 1536
VOCAB_PAD_MULTIPLE = 64

# A GLM-5-style chat template (written for these fixtures): [gMASK]<sop>, then role-tagged turns.
CHAT_TEMPLATE = (
    "[gMASK]<sop>"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}<|system|>\n{{ message['content'] }}"
    "{%- elif message['role'] == 'user' -%}<|user|>\n{{ message['content'] }}"
    "{%- elif message['role'] == 'assistant' -%}<|assistant|>\n{{ message['content'] }}"
    "{%- elif message['role'] in ('tool', 'observation') -%}<|observation|>\n{{ message['content'] }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>"
    "{%- if enable_thinking is defined and not enable_thinking -%}{{ '\\n<think></think>' }}{%- endif -%}"
    "{%- endif -%}"
)


@dataclass(frozen=True)
class TinyTokenizer:
    tokenizer_json: str  # as the tokenizers library saves it (no padding entries)
    tokens: list[str]  # GGUF token list: BPE vocab, special tokens, then [PAD{i}] up to the padded size
    token_types: list[int]
    merges: list[str]
    special_ids: dict[str, int]  # token text → id


@lru_cache(maxsize=4)
def tiny_tokenizer(pre: str = "glm4") -> TinyTokenizer:
    """Train a byte-level BPE vocabulary on the embedded corpus (deterministic) and add GLM special tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    from .tokenizer import TOKEN_CONTROL, TOKEN_NORMAL, TOKEN_UNUSED, make_pre_tokenizer

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = make_pre_tokenizer(pre)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=BPE_VOCAB_SIZE, min_frequency=1, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tokenizer.train_from_iterator([TINY_CORPUS], trainer=trainer)
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in GLM_SPECIAL_TOKENS])

    by_id = {i: t for t, i in tokenizer.get_vocab(with_added_tokens=True).items()}
    tokens = [by_id[i] for i in range(len(by_id))]
    special_ids = {t: tokenizer.token_to_id(t) for t in GLM_SPECIAL_TOKENS}
    types = [TOKEN_CONTROL if t in special_ids else TOKEN_NORMAL for t in tokens]
    # The converter pads the token list to the model's vocab size with unused [PAD{id}] entries.
    padded = -(-len(tokens) // VOCAB_PAD_MULTIPLE) * VOCAB_PAD_MULTIPLE
    tokens += [f"[PAD{i}]" for i in range(len(tokens), padded)]
    types += [TOKEN_UNUSED] * (padded - len(types))

    saved = tokenizer.to_str()
    merges = [m if isinstance(m, str) else " ".join(m) for m in json.loads(saved)["model"]["merges"]]
    return TinyTokenizer(saved, tokens, types, merges, special_ids)


def tiny_hf_config(*, layers: int, heads: int, index_heads: int, index_topk: int, mtp: bool,
                   tokenizer: TinyTokenizer, tie_embeddings: bool = False, intermediate: int = 512,
                   moe_intermediate: int = 256, indexer_types: str | None = None,
                   context_length: int = 8192) -> dict[str, Any]:
    """The HF glm_moe_dsa config.json of a tiny model (what build_hf_config must reproduce).

    indexer_types: one letter per trunk layer, F (own DSA indexer) or S (shares the previous full layer's top-k,
    no indexer weights), as GLM-5.2's config lists them; None: every layer full (GLM-5, 5.1)."""
    ids = tokenizer.special_ids
    config = {
        "architectures": [HF_ARCHITECTURE],
        "model_type": HF_MODEL_TYPE,
        "dtype": "bfloat16",
        "torch_dtype": "bfloat16",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "hidden_size": 256,
        "intermediate_size": intermediate,
        "moe_intermediate_size": moe_intermediate,
        "num_hidden_layers": layers,
        "num_nextn_predict_layers": 1 if mtp else 0,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "q_lora_rank": 256,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 192,
        "qk_rope_head_dim": 64,
        "qk_head_dim": 256,
        "v_head_dim": 256,
        "head_dim": 64,
        "index_n_heads": index_heads,
        "index_head_dim": 128,
        "index_topk": index_topk,
        "indexer_rope_interleave": True,
        "rope_interleave": True,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "n_group": 1,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "rms_norm_eps": 1e-05,
        "rope_parameters": {"rope_theta": 1000000, "rope_type": "default"},
        "rope_theta": 1000000,
        "rope_scaling": None,
        "max_position_embeddings": 8192,
        "vocab_size": len(tokenizer.tokens),
        "tie_word_embeddings": tie_embeddings,
        "ep_size": 1,
        "pretraining_tp": 1,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": ids["[gMASK]"],
        "eos_token_id": [ids["<|endoftext|>"], ids["<|user|>"], ids["<|observation|>"]],
        "pad_token_id": ids["<|endoftext|>"],
    }
    config["max_position_embeddings"] = context_length
    if indexer_types is not None:
        if len(indexer_types) != layers or set(indexer_types) - {"F", "S"} or indexer_types[:1] != "F":
            raise ValueError(f"indexer_types {indexer_types!r}: expected {layers} letters F/S, the first F")
        config["indexer_types"] = ["full" if t == "F" else "shared" for t in indexer_types]
    return config


def hf_weight_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """HF checkpoint tensor names → shapes (torch [out, in]); MTP block at index num_hidden_layers."""
    c = config
    hidden, vocab = c["hidden_size"], c["vocab_size"]
    heads, nope, rope, v_dim = c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    shared = c["moe_intermediate_size"] * c["n_shared_experts"]
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,)}
    if not c["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (vocab, hidden)
    for layer in range(c["num_hidden_layers"] + c["num_nextn_predict_layers"]):
        p = f"model.layers.{layer}."
        shapes.update({
            p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
            p + "self_attn.q_a_proj.weight": (c["q_lora_rank"], hidden),
            p + "self_attn.q_a_layernorm.weight": (c["q_lora_rank"],),
            p + "self_attn.q_b_proj.weight": (heads * (nope + rope), c["q_lora_rank"]),
            p + "self_attn.kv_a_proj_with_mqa.weight": (c["kv_lora_rank"] + rope, hidden),
            p + "self_attn.kv_a_layernorm.weight": (c["kv_lora_rank"],),
            p + "self_attn.kv_b_proj.weight": (heads * (nope + v_dim), c["kv_lora_rank"]),
            p + "self_attn.o_proj.weight": (hidden, heads * v_dim),
        })
        if not layer_shares_topk(c, layer) or c.get("_shared_indexer_weights"):
            shapes.update({
                p + "self_attn.indexer.wq_b.weight": (c["index_n_heads"] * c["index_head_dim"], c["q_lora_rank"]),
                p + "self_attn.indexer.wk.weight": (c["index_head_dim"], hidden),
                p + "self_attn.indexer.k_norm.weight": (c["index_head_dim"],),
                p + "self_attn.indexer.k_norm.bias": (c["index_head_dim"],),
                p + "self_attn.indexer.weights_proj.weight": (c["index_n_heads"], hidden),
            })
        if layer < c["first_k_dense_replace"]:
            for proj in ("gate_proj", "up_proj"):
                shapes[p + f"mlp.{proj}.weight"] = (c["intermediate_size"], hidden)
            shapes[p + "mlp.down_proj.weight"] = (hidden, c["intermediate_size"])
        else:
            shapes[p + "mlp.gate.weight"] = (c["n_routed_experts"], hidden)
            shapes[p + "mlp.gate.e_score_correction_bias"] = (c["n_routed_experts"],)
            for e in range(c["n_routed_experts"]):
                shapes[p + f"mlp.experts.{e}.gate_proj.weight"] = (c["moe_intermediate_size"], hidden)
                shapes[p + f"mlp.experts.{e}.up_proj.weight"] = (c["moe_intermediate_size"], hidden)
                shapes[p + f"mlp.experts.{e}.down_proj.weight"] = (hidden, c["moe_intermediate_size"])
            shapes[p + "mlp.shared_experts.gate_proj.weight"] = (shared, hidden)
            shapes[p + "mlp.shared_experts.up_proj.weight"] = (shared, hidden)
            shapes[p + "mlp.shared_experts.down_proj.weight"] = (hidden, shared)
        if layer >= c["num_hidden_layers"]:
            shapes[p + "eh_proj.weight"] = (hidden, 2 * hidden)
            for norm in ("enorm", "hnorm", "shared_head.norm"):
                shapes[p + f"{norm}.weight"] = (hidden,)
    return shapes


# End-to-end tests: see random_hf_weights for what these values were measured to give.
PEAKED = {"residual_scale": 0.05, "bigram_gain": 1.0}

# Projections that write into the residual stream (scaled by `residual_scale`).
_RESIDUAL_WRITERS = ("self_attn.o_proj.weight", "down_proj.weight")


def random_hf_weights(config: dict[str, Any], seed: int, *, residual_scale: float = 1.0,
                      bigram_gain: float = 0.0, bigram_tokens: list[int] | None = None) -> dict[str, np.ndarray]:
    """Deterministic float32 weights: norms near 1, biases and matrices small and zero-mean.

    residual_scale multiplies every projection that writes into the residual stream (o_proj, dense/shared/
    expert down_proj). At 1.0 a random model is chaotic: the residual stream grows layer after layer, and a
    bf16 rounding that flips one MoE route or one indexer pick changes the next token (top-1 agreement of
    bf16 vs float32 is ~78%), so two correct implementations cannot be compared token by token.
    bigram_gain adds gain * embed[t] to lm_head row perm(t), perm a fixed permutation of bigram_tokens (the ids
    of ordinary tokens; by default all), so the next-token choice has a margin the layers modulate rather than
    decide. Measured with the float32 reference (16 heads, 3 layers, ~900-token prompt): residual_scale 0.05 and
    bigram_gain 1.0 give a top-1 margin of >= 0.5 nats at 99% of positions, bf16-vs-float32 top-1 agreement
    99.9%, and attention still matters: dense instead of top-128 sparse attention moves the top-1 log-probability
    by 0.135 nats (median).
    """
    rng = np.random.default_rng(seed)
    weights = {}
    for name, shape in hf_weight_shapes(config).items():
        if len(shape) == 1 and name.endswith("norm.weight"):
            values = 1.0 + 0.1 * rng.standard_normal(shape)
        elif len(shape) == 1:
            values = 0.1 * rng.standard_normal(shape)
        else:
            values = rng.standard_normal(shape) / math.sqrt(shape[-1])
            if name.endswith(_RESIDUAL_WRITERS):
                values = values * residual_scale
        weights[name] = values.astype(np.float32)
    if bigram_gain:
        if config["tie_word_embeddings"]:
            raise ValueError("bigram_gain needs an untied lm_head")
        embed = weights["model.embed_tokens.weight"]
        ordinary = np.asarray(bigram_tokens if bigram_tokens is not None else range(embed.shape[0]))
        perm = np.random.default_rng(seed + 1).permutation(ordinary)
        weights["lm_head.weight"][perm] += (bigram_gain * embed[ordinary]).astype(np.float32)
    return weights


# Converter-side renames inside a block (HF suffix → GGUF suffix).
_HF_TO_GGUF_BLOCK = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_a_proj.weight": "attn_q_a.weight",
    "self_attn.q_a_layernorm.weight": "attn_q_a_norm.weight",
    "self_attn.q_b_proj.weight": "attn_q_b.weight",
    "self_attn.kv_a_proj_with_mqa.weight": "attn_kv_a_mqa.weight",
    "self_attn.kv_a_layernorm.weight": "attn_kv_a_norm.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.indexer.wq_b.weight": "indexer.attn_q_b.weight",
    "self_attn.indexer.wk.weight": "indexer.attn_k.weight",
    "self_attn.indexer.k_norm.weight": "indexer.k_norm.weight",
    "self_attn.indexer.k_norm.bias": "indexer.k_norm.bias",
    "self_attn.indexer.weights_proj.weight": "indexer.proj.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.gate.e_score_correction_bias": "exp_probs_b.bias",
    "mlp.shared_experts.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_experts.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_experts.down_proj.weight": "ffn_down_shexp.weight",
    "eh_proj.weight": "nextn.eh_proj.weight",
    "enorm.weight": "nextn.enorm.weight",
    "hnorm.weight": "nextn.hnorm.weight",
    "shared_head.norm.weight": "nextn.shared_head_norm.weight",
}
_HF_TO_GGUF_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                      "lm_head.weight": "output.weight"}


def hf_to_gguf_tensors(weights: dict[str, np.ndarray], config: dict[str, Any]) -> dict[str, np.ndarray]:
    """Apply the converter's transforms: renames, kv_b split, expert stacking (float32, numpy order)."""
    out: dict[str, np.ndarray] = {}
    for hf_name, gguf_name in _HF_TO_GGUF_GLOBAL.items():
        if hf_name in weights:
            out[gguf_name] = weights[hf_name]
    for layer in range(config["num_hidden_layers"] + config["num_nextn_predict_layers"]):
        p, blk = f"model.layers.{layer}.", f"blk.{layer}."
        for hf_suffix, gguf_suffix in _HF_TO_GGUF_BLOCK.items():
            if p + hf_suffix in weights:
                out[blk + gguf_suffix] = weights[p + hf_suffix]
        k_b, v_b = split_kv_b(weights[p + "self_attn.kv_b_proj.weight"], config, layer=layer)
        out[blk + "attn_k_b.weight"] = k_b
        out[blk + "attn_v_b.weight"] = v_b
        if p + "mlp.experts.0.gate_proj.weight" in weights:
            for proj in ("gate", "up", "down"):
                out[blk + f"ffn_{proj}_exps.weight"] = np.stack(
                    [weights[p + f"mlp.experts.{e}.{proj}_proj.weight"] for e in range(config["n_routed_experts"])])
    return out


def choose_type(gguf_name: str, array: np.ndarray, quant: str, overrides: dict[str, str] | None = None) -> str:
    """The type of one tensor in a `quant` file (see QUANT_TYPES); overrides win."""
    if overrides and gguf_name in overrides:
        return overrides[gguf_name]
    if quant in CONVERTER_OUTTYPES:
        return converter_type(gguf_name, array.shape, quant)
    if converter_keeps_f32(gguf_name, array.ndim) and not gguf_name.endswith("indexer.proj.weight"):
        return "F32"
    return fit_to_row(quant, array.shape[-1])


def encode_tensor(array: np.ndarray, type_name: str) -> tuple[np.ndarray, gguf.GGMLQuantizationType | None]:
    """(data, raw_dtype) ready for GGUFWriter.add_tensor."""
    qtype = gguf.GGMLQuantizationType[type_name]
    if type_name == "F32":
        return np.ascontiguousarray(array, dtype=np.float32), None
    if type_name == "F16":
        return np.ascontiguousarray(array, dtype=np.float16), None
    if type_name in _KQUANTIZERS:
        return _KQUANTIZERS[type_name](array), qtype
    try:
        return gguf.quants.quantize(np.ascontiguousarray(array, dtype=np.float32), qtype), qtype
    except NotImplementedError:
        raise ValueError(f"type {type_name}: the generator has no quantizer for it") from None


_KQUANTIZERS = {"Q2_K": quantize_q2_k, "Q3_K": quantize_q3_k, "Q4_K": quantize_q4_k, "Q5_K": quantize_q5_k,
                "Q6_K": quantize_q6_k}


def file_type_of(quant: str, preset: str | None = None) -> gguf.LlamaFileType:
    """general.file_type as the tools write it."""
    if preset is not None:
        return PRESET_FILE_TYPES[preset]
    return FILE_TYPES.get(quant, gguf.LlamaFileType.GUESSED)


def glm_dsa_metadata(config: dict[str, Any], tokenizer: TinyTokenizer, file_type: int, pre: str) -> dict[str, tuple]:
    """key → (value, GGUFValueType) in the order llama.cpp's GlmMoeDsaModel converter writes them
    (general.size_label, which depends on the tensors, is added by make_tiny after general.name)."""
    V = gguf.GGUFValueType
    c = config
    a = ARCH + "."
    ids = tokenizer.special_ids
    kv = {
        "general.type": ("model", V.STRING),
        "general.name": ("GLM-5 tiny test model", V.STRING),
        a + "block_count": (c["num_hidden_layers"] + c["num_nextn_predict_layers"], V.UINT32),
        a + "context_length": (c["max_position_embeddings"], V.UINT32),
        a + "embedding_length": (c["hidden_size"], V.UINT32),
        a + "feed_forward_length": (c["intermediate_size"], V.UINT32),
        a + "attention.head_count": (c["num_attention_heads"], V.UINT32),
        a + "attention.head_count_kv": (1, V.UINT32),  # MLA is run as MQA over the latent
        a + "rope.freq_base": (float(c["rope_parameters"]["rope_theta"]), V.FLOAT32),
        a + "attention.layer_norm_rms_epsilon": (c["rms_norm_eps"], V.FLOAT32),
        a + "expert_count": (c["n_routed_experts"], V.UINT32),
        a + "expert_used_count": (c["num_experts_per_tok"], V.UINT32),
        a + "expert_group_count": (c["n_group"], V.UINT32),
        a + "expert_group_used_count": (c["topk_group"], V.UINT32),
        a + "expert_gating_func": (2, V.UINT32),  # sigmoid
        a + "attention.key_length": (c["kv_lora_rank"] + c["qk_rope_head_dim"], V.UINT32),
        a + "attention.value_length": (c["kv_lora_rank"], V.UINT32),
        "general.file_type": (int(file_type), V.UINT32),
        a + "leading_dense_block_count": (c["first_k_dense_replace"], V.UINT32),
        a + "vocab_size": (c["vocab_size"], V.UINT32),
        a + "attention.q_lora_rank": (c["q_lora_rank"], V.UINT32),
        a + "attention.kv_lora_rank": (c["kv_lora_rank"], V.UINT32),
        a + "attention.key_length_mla": (c["qk_nope_head_dim"] + c["qk_rope_head_dim"], V.UINT32),
        a + "attention.value_length_mla": (c["v_head_dim"], V.UINT32),
        a + "expert_feed_forward_length": (c["moe_intermediate_size"], V.UINT32),
        a + "expert_shared_count": (c["n_shared_experts"], V.UINT32),
        a + "expert_weights_scale": (c["routed_scaling_factor"], V.FLOAT32),
        a + "expert_weights_norm": (c["norm_topk_prob"], V.BOOL),
        a + "rope.dimension_count": (c["qk_rope_head_dim"], V.UINT32),
        a + "nextn_predict_layers": (c["num_nextn_predict_layers"], V.UINT32),
        a + "attention.indexer.head_count": (c["index_n_heads"], V.UINT32),
        a + "attention.indexer.key_length": (c["index_head_dim"], V.UINT32),
        a + "attention.indexer.top_k": (c["index_topk"], V.UINT32),
        **({a + INDEXER_TYPES_KEY: ([t == "full" for t in c["indexer_types"]], V.ARRAY)}
           if c.get("indexer_types") else {}),
        "general.quantization_version": (gguf.GGML_QUANT_VERSION, V.UINT32),
        "tokenizer.ggml.model": ("gpt2", V.STRING),
        "tokenizer.ggml.pre": (pre, V.STRING),
        "tokenizer.ggml.tokens": (tokenizer.tokens, V.ARRAY),
        "tokenizer.ggml.token_type": (tokenizer.token_types, V.ARRAY),
        "tokenizer.ggml.merges": (tokenizer.merges, V.ARRAY),
        "tokenizer.ggml.eos_token_id": (ids["<|endoftext|>"], V.UINT32),
        "tokenizer.ggml.padding_token_id": (ids["<|endoftext|>"], V.UINT32),
        "tokenizer.ggml.bos_token_id": (ids["[gMASK]"], V.UINT32),
        "tokenizer.ggml.eot_token_id": (ids["<|user|>"], V.UINT32),
        "tokenizer.ggml.unknown_token_id": (ids["<|endoftext|>"], V.UINT32),
        "tokenizer.ggml.eom_token_id": (ids["<|observation|>"], V.UINT32),
        "tokenizer.chat_template": (CHAT_TEMPLATE, V.STRING),
    }
    return kv


def _value_type_for(value: Any) -> gguf.GGUFValueType:
    V = gguf.GGUFValueType
    if isinstance(value, bool):
        return V.BOOL
    if isinstance(value, int):
        return V.UINT32 if value >= 0 else V.INT32
    if isinstance(value, float):
        return V.FLOAT32
    if isinstance(value, str):
        return V.STRING
    if isinstance(value, (list, tuple)):
        return V.ARRAY
    raise TypeError(f"cannot store {type(value).__name__} in GGUF metadata")


def _same_kind(a: gguf.GGUFValueType, b: gguf.GGUFValueType) -> bool:
    V = gguf.GGUFValueType
    integers = {V.UINT8, V.INT8, V.UINT16, V.INT16, V.UINT32, V.INT32, V.UINT64, V.INT64}
    floats = {V.FLOAT32, V.FLOAT64}
    return a == b or (a in integers and b in integers) or (a in floats and b in floats)


def reference_dir(out_path: str | Path) -> Path:
    """`<dir>/<stem>.reference/` for `<dir>/<stem>.gguf`."""
    out_path = Path(out_path)
    return out_path.with_name(out_path.stem + ".reference")


def make_tiny(out_path: str | Path, quant: str = "Q8_0", layers: int = 3, shards: int = 1, mtp: bool = True,
              heads: int = 4, index_heads: int = 32, index_topk: int = 128, seed: int = 0, *,
              overrides: dict[str, str] | None = None,
              metadata_overrides: dict[str, Any] | None = None,
              tensor_hook: Callable[[str, np.ndarray], np.ndarray | None] | None = None,
              extra_tensors: dict[str, np.ndarray] | None = None,
              tie_embeddings: bool = False, tokenizer_pre: str = "glm4",
              write_reference: bool = True, residual_scale: float = 1.0, bigram_gain: float = 0.0,
              reference: str = "float", intermediate: int = 512, moe_intermediate: int = 256,
              preset: str | None = None, order: str = "auto", indexer_types: str | None = None,
              context_length: int = 8192, indexer_types_key: bool = True,
              shared_indexer_weights: bool = False, split_mtp: str | None = None) -> list[Path]:
    """Write a tiny random glm-dsa GGUF (or `shards` files) and its reference directory; return the GGUF paths.

    quant: one of QUANT_TYPES.  F32/F16/BF16/Q8_0: the file convert_hf_to_gguf.py writes with that --outtype (norms,
      router, biases and indexer.proj stay F32); Q4_0/Q5_0/Q4_K/Q6_K: every quantizable tensor of that type (norms,
      router, biases F32), rows that do not fit the type's blocks falling back as llama-quantize does.
    preset: a llama-quantize preset (llama_tools.QUANTIZE_PRESETS, e.g. "Q4_K_M"): the file llama-quantize writes from
      the converter's BF16 file, with the per-tensor types it assigns (quant is then ignored).
    order: tensor order (ORDERS): "auto" is the order of the tool that writes such a file (the converter for
      quant, llama-quantize for a preset); "legacy" is the generator's old order (attn_q_a first).
    overrides: GGUF tensor name → type name, applied last (any type gguf.quants can quantize, for tests).
    metadata_overrides: key → value (None deletes the key); a value of the same kind (integer, float...)
      keeps the original key's GGUF type, another kind changes it (to write deliberately bad files).
    tensor_hook: called as hook(gguf_name, float32 array) before encoding; return a replacement array,
      or None to leave the tensor out. The reference weights are not affected.
    extra_tensors: GGUF name → float32 array, written after the model's own tensors (for tests).
    residual_scale, bigram_gain: see random_hf_weights (PEAKED holds the values end-to-end tests use).
    intermediate, moe_intermediate: FFN widths (dense, per expert). vLLM splits the down projections' rows across
      tensor-parallel ranks in whole quantization blocks (glm5_shim.gguf.tp_split): a Q4_K file meant for TP t needs
      widths that are multiples of 256 * t.
    reference: "float" writes the float weights the GGUF was made from; "dequantized" writes what the GGUF
      stores, decoded back to float32 under HF names, so a float32 reference model differs from an engine
      running the GGUF only by arithmetic, not by quantization error.
    indexer_types: GLM-5.2's shared indexers, one letter per trunk layer (F full, S shared), or "glm52" for
      GLM-5.2's own layout (F F F S S S F S S S ...); shared layers have no indexer weights, and the file carries
      glm-dsa.attention.indexer.types as the converter writes it (indexer_types_key=False leaves the key out, as
      files converted before the key existed do).  shared_indexer_weights: shared layers keep indexer weights
      anyway (some published GLM-5.2 GGUFs do).
    context_length: glm-dsa.context_length (max_position_embeddings); GLM-5.2 has 1048576.
    split_mtp: one of SPLIT_MTP, or None for the whole model.  "trunk": the file `convert_hf_to_gguf.py --no-mtp`
      writes (no MTP block, block_count = layers, no nextn_predict_layers key); "mtp": the file `--mtp` writes
      (token_embd, output_norm, output and the MTP block blk.{layers} only, the whole model's metadata; needs
      mtp=True); "stripped": the whole model's metadata without the MTP block's tensors.  The reference directory
      is the whole HF checkpoint either way (the converter makes both split files from it).
    """
    if reference not in ("float", "dequantized"):
        raise ValueError(f"reference {reference!r}: expected 'float' or 'dequantized'")
    if preset is None and quant not in QUANT_TYPES:
        raise ValueError(f"quant {quant!r}: expected one of {', '.join(QUANT_TYPES)}")
    if preset is not None and preset not in QUANTIZE_PRESETS:
        raise ValueError(f"preset {preset!r}: expected one of {', '.join(QUANTIZE_PRESETS)}")
    if order not in ORDERS:
        raise ValueError(f"order {order!r}: expected one of {', '.join(ORDERS)}")
    if layers < 2:
        raise ValueError(f"layers={layers}: expected at least 2 (one dense block, one MoE block)")
    if shards < 1:
        raise ValueError(f"shards={shards}: expected at least 1")
    if split_mtp is not None and split_mtp not in SPLIT_MTP:
        raise ValueError(f"split_mtp {split_mtp!r}: expected one of {', '.join(SPLIT_MTP)}")
    if split_mtp in ("mtp", "stripped") and not mtp:
        raise ValueError(f"split_mtp={split_mtp!r} needs the MTP block (mtp=True)")
    out_path = Path(out_path)
    if out_path.suffix != ".gguf":
        raise ValueError(f"{out_path}: expected a path ending in .gguf")
    out_path.parent.mkdir(parents=True, exist_ok=True)

    tokenizer = tiny_tokenizer(tokenizer_pre)
    if indexer_types == "glm52":
        indexer_types = "".join("F" if glm52_layer_is_full(i) else "S" for i in range(layers))
    config = tiny_hf_config(layers=layers, heads=heads, index_heads=index_heads, index_topk=index_topk, mtp=mtp,
                            tokenizer=tokenizer, tie_embeddings=tie_embeddings, intermediate=intermediate,
                            moe_intermediate=moe_intermediate, indexer_types=indexer_types,
                            context_length=context_length)
    from .tokenizer import TOKEN_NORMAL

    ordinary = [i for i, kind in enumerate(tokenizer.token_types) if kind == TOKEN_NORMAL]
    weights = random_hf_weights(dict(config, _shared_indexer_weights=shared_indexer_weights), seed,
                                residual_scale=residual_scale, bigram_gain=bigram_gain, bigram_tokens=ordinary)
    tensors = hf_to_gguf_tensors(weights, config)
    if order == "auto":
        order = "quantize" if preset is not None else "converter"
    if order == "converter":
        names = converter_order(weights, config["n_routed_experts"], lambda hf: _gguf_names_of(hf, tensors))
        tensors = {name: tensors[name] for name in names}
    elif order == "quantize":
        tensors = {name: tensors[name] for name in quantize_order(tensors)}
    if split_mtp is not None:
        tensors = {name: array for name, array in tensors.items()
                   if _kept_by_split_mtp(name, config["num_hidden_layers"], split_mtp)}
    tensors.update(extra_tensors or {})
    if preset is not None:
        # llama-quantize counts the layers the file declares (block_count): the trunk file has no MTP block.
        types = preset_types(tensors, dict(config, num_nextn_predict_layers=0) if split_mtp == "trunk" else config,
                             preset)
        # llama-quantize reads the converter's BF16 file: its float tensors are bf16-rounded first.
        tensors = {n: a if converter_keeps_f32(n, a.ndim) else _round_bf16(a) for n, a in tensors.items()}
    else:
        types = {name: choose_type(name, array, quant) for name, array in tensors.items()}
    types.update(overrides or {})

    metadata = glm_dsa_metadata(config, tokenizer, file_type_of(quant, preset), tokenizer_pre)
    if not indexer_types_key:
        metadata.pop(ARCH + "." + INDEXER_TYPES_KEY, None)
    if split_mtp == "trunk":  # the converter's --no-mtp: as if the checkpoint had no MTP block and no nextn key
        metadata[ARCH + ".block_count"] = (config["num_hidden_layers"], gguf.GGUFValueType.UINT32)
        metadata.pop(ARCH + ".nextn_predict_layers", None)
    for key, value in (metadata_overrides or {}).items():
        if value is None:
            metadata.pop(key, None)
        else:
            vtype = _value_type_for(value)
            if key in metadata and _same_kind(metadata[key][1], vtype):
                vtype = metadata[key][1]  # keep e.g. UINT32 vs INT32 as the converter wrote it
            metadata[key] = (value, vtype)

    encoded = []
    for name, array in tensors.items():
        if tensor_hook is not None:
            array = tensor_hook(name, array)
            if array is None:
                continue
        encoded.append((name, *encode_tensor(array, types[name])))

    per_shard = math.ceil(len(encoded) / shards) if shards > 1 else 0
    writer = gguf.GGUFWriter(out_path, ARCH, split_max_tensors=per_shard)
    for name, data, raw_dtype in encoded:
        writer.add_tensor(name, data, raw_dtype=raw_dtype)
    if "general.size_label" not in (metadata_overrides or {}):
        size_label = gguf.size_label(*writer.get_total_parameter_count()[:3], config["n_routed_experts"])
        metadata = _insert_after(metadata, "general.name", "general.size_label",
                                 (size_label, gguf.GGUFValueType.STRING))
    for key, (value, vtype) in metadata.items():
        if key == "general.architecture":
            writer.kv_data[0].pop(key, None)  # the writer set it already; replace without a warning
        writer.add_key_value(key, value, vtype)
    if len(writer.tensors) != shards:
        raise ValueError(f"cannot split {len(encoded)} tensors into {shards} shards")
    paths = writer.format_shard_names(out_path)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    if write_reference:
        if reference == "dequantized":
            weights = gguf_to_hf_weights({name: decode_tensor(data, raw) for name, data, raw in encoded}, config)
        _write_reference(reference_dir(out_path), weights, config, tokenizer)
    return [Path(p) for p in paths]


def _kept_by_split_mtp(gguf_name: str, num_hidden_layers: int, split_mtp: str) -> bool:
    """Whether a tensor of the whole model is in the split_mtp file (SPLIT_MTP)."""
    layer = layer_of(gguf_name)
    is_mtp = layer is not None and layer >= num_hidden_layers
    if split_mtp == "mtp":  # the converter's --mtp keeps the MTP block and the embeddings, final norm and head
        return is_mtp or gguf_name in ("token_embd.weight", "output_norm.weight", "output.weight")
    return not is_mtp


def _gguf_names_of(hf_name: str, tensors: dict[str, np.ndarray]) -> list[str]:
    """The GGUF tensors the converter makes of one HF tensor (kv_b_proj → attn_k_b, attn_v_b; experts excluded)."""
    if hf_name in _HF_TO_GGUF_GLOBAL:
        return [_HF_TO_GGUF_GLOBAL[hf_name]]
    _, _, layer, suffix = hf_name.split(".", 3)
    if suffix == "self_attn.kv_b_proj.weight":
        return [f"blk.{layer}.attn_k_b.weight", f"blk.{layer}.attn_v_b.weight"]
    return [f"blk.{layer}.{_HF_TO_GGUF_BLOCK[suffix]}"]


def preset_types(tensors: dict[str, np.ndarray], config: dict[str, Any], preset: str) -> dict[str, str]:
    """The types llama-quantize assigns with `preset` to the converter's BF16 file of these tensors."""
    source = {n: ("F32" if converter_keeps_f32(n, a.ndim) else "BF16", a.shape) for n, a in tensors.items()}
    return quantize_types(source, preset, n_layers_all=config["num_hidden_layers"] + config["num_nextn_predict_layers"],
                          n_experts=config["n_routed_experts"], n_gqa=config["num_attention_heads"])


def _round_bf16(array: np.ndarray) -> np.ndarray:
    """float32 → the nearest bfloat16, as float32 (round to nearest even)."""
    bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32)


def _insert_after(items: dict, after: str, key: str, value) -> dict:
    out = {}
    for k, v in items.items():
        out[k] = v
        if k == after:
            out[key] = value
    if key not in out:
        out[key] = value
    return out


def decode_tensor(data: np.ndarray, raw_dtype: gguf.GGMLQuantizationType | None) -> np.ndarray:
    """The float32 values an encoded tensor stands for (the inverse of encode_tensor, up to its rounding)."""
    if raw_dtype is None:
        return np.asarray(data, dtype=np.float32)
    return np.asarray(gguf.quants.dequantize(data, raw_dtype), dtype=np.float32)


def gguf_to_hf_weights(tensors: dict[str, np.ndarray], config: dict[str, Any]) -> dict[str, np.ndarray]:
    """The inverse of hf_to_gguf_tensors: GGUF names (float32) → HF names, kv_b_proj rebuilt, experts unstacked."""
    to_hf_global = {g: h for h, g in _HF_TO_GGUF_GLOBAL.items()}
    to_hf_block = {g: h for h, g in _HF_TO_GGUF_BLOCK.items()}
    out: dict[str, np.ndarray] = {}
    for name, array in tensors.items():
        if name in to_hf_global:
            out[to_hf_global[name]] = array
            continue
        _, layer, suffix = name.split(".", 2)
        p = f"model.layers.{layer}."
        if suffix in to_hf_block:
            out[p + to_hf_block[suffix]] = array
        elif suffix.startswith("ffn_") and suffix.endswith("_exps.weight"):
            proj = suffix[len("ffn_"):-len("_exps.weight")]
            for e in range(array.shape[0]):
                out[p + f"mlp.experts.{e}.{proj}_proj.weight"] = np.ascontiguousarray(array[e])
        elif suffix == "attn_k_b.weight":
            out[p + "self_attn.kv_b_proj.weight"] = rebuild_kv_b(
                array, tensors[f"blk.{layer}.attn_v_b.weight"], config, layer=layer)
        elif suffix != "attn_v_b.weight":
            raise ValueError(f"gguf_to_hf_weights: no HF name for GGUF tensor {name}")
    return out


def _write_reference(directory: Path, weights: dict[str, np.ndarray], config: dict[str, Any],
                     tokenizer: TinyTokenizer) -> None:
    """An HF checkpoint directory: model.safetensors, config.json, tokenizer.json and tokenizer_config.json (which
    names the tokenizer class, as GLM's checkpoints do, so llama.cpp's converter can read it with any transformers)."""
    from safetensors.numpy import save_file

    directory.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(directory / "model.safetensors"), metadata={"format": "np"})
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    (directory / "tokenizer.json").write_text(tokenizer.tokenizer_json, encoding="utf-8")
    tokenizer_config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>",
                        "pad_token": "<|endoftext|>", "clean_up_tokenization_spaces": False,
                        "model_max_length": config["max_position_embeddings"], "chat_template": CHAT_TEMPLATE}
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n", encoding="utf-8")


def write_dequantized_reference(gguf_path: str | Path, like: str | Path) -> Path:
    """`<stem>.reference/` for any glm-dsa GGUF (one file, e.g. written by llama.cpp's own tools): the tensors it
    stores decoded to float32 under HF names, with config and tokenizer files copied from the reference dir `like`."""
    import shutil

    from safetensors.numpy import save_file

    config = json.loads((Path(like) / "config.json").read_text(encoding="utf-8"))
    reader = gguf.GGUFReader(str(gguf_path))
    decoded = {t.name: decode_tensor(t.data, None if t.tensor_type in (gguf.GGMLQuantizationType.F32,
                                                                       gguf.GGMLQuantizationType.F16)
                                     else t.tensor_type) for t in reader.tensors}
    out = reference_dir(gguf_path)
    out.mkdir(parents=True, exist_ok=True)
    save_file(gguf_to_hf_weights(decoded, config), str(out / "model.safetensors"), metadata={"format": "np"})
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        if Path(like, name).resolve() != (out / name).resolve():
            shutil.copyfile(Path(like) / name, out / name)
    return out


# --- command line ---------------------------------------------------------------------------------------

def add_make_tiny_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("out", metavar="OUT.gguf", help="output file (shards get -0000k-of-0000N inserted)")
    parser.add_argument("--quant", default="Q8_0", choices=QUANT_TYPES,
                        help="F32/F16/BF16/Q8_0: the file convert_hf_to_gguf.py writes with that --outtype; "
                             "Q4_0/Q5_0/Q4_K/Q6_K: every quantizable tensor of that type")
    parser.add_argument("--preset", choices=tuple(QUANTIZE_PRESETS),
                        help="the file llama-quantize writes with this preset from the converter's BF16 file "
                             "(its per-tensor types and order); overrides --quant")
    parser.add_argument("--order", choices=ORDERS, default="auto",
                        help="tensor order: auto (that of the tool that writes such a file), converter, quantize, "
                             "or legacy (the generator's old order, attn_q_a first)")
    parser.add_argument("--layers", type=int, default=3, help="decoder layers, without the MTP layer (>= 2)")
    parser.add_argument("--shards", type=int, default=1, help="number of GGUF files")
    parser.add_argument("--heads", type=int, default=4, help="attention heads")
    parser.add_argument("--index-heads", type=int, default=32, help="DSA indexer heads")
    parser.add_argument("--index-topk", type=int, default=128, help="DSA indexer top-k")
    parser.add_argument("--no-mtp", action="store_true", help="leave out the MTP (nextn) layer")
    parser.add_argument("--indexer-types", metavar="PATTERN",
                        help="GLM-5.2's shared indexers: one letter per layer, F (own indexer) or S (reuses the "
                             "previous full layer's top-k, no indexer weights), or glm52 for GLM-5.2's layout")
    parser.add_argument("--no-indexer-types-key", action="store_true",
                        help="leave glm-dsa.attention.indexer.types out (llama.cpp then decides from the context)")
    parser.add_argument("--shared-indexer-weights", action="store_true",
                        help="shared layers keep indexer weights (as some published GLM-5.2 GGUFs do)")
    parser.add_argument("--context-length", type=int, default=8192,
                        help="glm-dsa.context_length (GLM-5.2: 1048576)")
    parser.add_argument("--split-mtp", choices=SPLIT_MTP,
                        help="one of the files llama.cpp's converter writes when trunk and MTP draft are published "
                             "apart: trunk (convert_hf_to_gguf.py --no-mtp) or mtp (--mtp: only the MTP block and "
                             "the embeddings); stripped: the whole model's metadata without the MTP tensors")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the weights")
    parser.add_argument("--intermediate", type=int, default=512, help="dense FFN width")
    parser.add_argument("--moe-intermediate", type=int, default=256,
                        help="expert FFN width (a Q4_K file for tensor parallel t needs a multiple of 256 * t)")
    parser.add_argument("--peaked", action="store_true",
                        help=f"a model whose next-token choice two correct engines agree on (residual scale "
                             f"{PEAKED['residual_scale']}, bigram gain {PEAKED['bigram_gain']}); for end-to-end tests")
    parser.add_argument("--reference", choices=("float", "dequantized"), default="float",
                        help="reference weights: the float ones the GGUF was made from, or what the GGUF stores")
    return parser


def run_make_tiny(args: argparse.Namespace) -> int:
    paths = make_tiny(args.out, quant=args.quant, layers=args.layers, shards=args.shards, mtp=not args.no_mtp,
                      heads=args.heads, index_heads=args.index_heads, index_topk=args.index_topk, seed=args.seed,
                      reference=args.reference, intermediate=args.intermediate, moe_intermediate=args.moe_intermediate,
                      preset=args.preset, order=args.order, indexer_types=args.indexer_types,
                      indexer_types_key=not args.no_indexer_types_key,
                      shared_indexer_weights=args.shared_indexer_weights, context_length=args.context_length,
                      split_mtp=args.split_mtp, **(PEAKED if args.peaked else {}))
    for path in paths:
        print(path)
    print(reference_dir(args.out))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m glm5_shim.gguf.fixture",
                                     description="Write tiny random GLM-5 (glm-dsa) GGUF test models.")
    commands = parser.add_subparsers(dest="command", required=True)
    add_make_tiny_arguments(commands.add_parser("make-tiny", help="write a tiny glm-dsa GGUF and its reference"))
    args = parser.parse_args(argv)
    try:
        return run_make_tiny(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
