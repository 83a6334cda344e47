"""GGUF metadata → HF glm_moe_dsa config, compared with the config the generator started from."""

from __future__ import annotations

import pytest

from glm5_shim.gguf.config import build_hf_config
from glm5_shim.gguf.errors import GGUFError
from glm5_shim.gguf.reader import open_gguf

# The fields vLLM 0.23's deepseek_v2.py reads from the HF config (plus the ones the brief asks for).
VLLM_FIELDS = {
    "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
    "index_n_heads", "index_head_dim", "index_topk", "indexer_rope_interleave", "n_routed_experts",
    "n_shared_experts", "num_experts_per_tok", "first_k_dense_replace", "moe_layer_freq", "routed_scaling_factor",
    "n_group", "topk_group", "norm_topk_prob", "scoring_func", "topk_method", "rope_parameters", "rms_norm_eps",
    "vocab_size", "max_position_embeddings", "num_nextn_predict_layers", "hidden_act", "model_type",
    "qk_head_dim", "head_dim", "rope_interleave", "rope_theta", "rope_scaling", "architectures",
    "tie_word_embeddings", "attention_bias", "dtype", "torch_dtype", "eos_token_id", "pad_token_id", "bos_token_id",
}


@pytest.mark.parametrize("variant", ["default", "no-mtp", "tied-2heads-sharded"])
def test_config_equals_generator_config(tiny, q8, variant):
    if variant == "default":
        model = q8
    elif variant == "no-mtp":
        model = tiny("cfg-no-mtp", quant="F16", mtp=False, layers=2, index_heads=8, index_topk=64)
    else:
        model = tiny("cfg-tied", quant="BF16", heads=2, tie_embeddings=True, shards=2, index_heads=4)
    config = build_hf_config(open_gguf(model.path))
    expected = model.config
    assert set(config) == set(expected)
    for key in expected:
        assert config[key] == expected[key], key
    assert VLLM_FIELDS <= set(config)


def test_glm5_specific_values(q8):
    config = build_hf_config(open_gguf(q8.path))
    meta = open_gguf(q8.path).metadata
    assert meta["glm-dsa.attention.head_count_kv"] == 1
    assert config["num_key_value_heads"] == config["num_attention_heads"] == 4
    assert config["num_hidden_layers"] == meta["glm-dsa.block_count"] - meta["glm-dsa.nextn_predict_layers"] == 3
    assert config["qk_head_dim"] == 256 and config["qk_nope_head_dim"] == 192 and config["head_dim"] == 64
    assert config["rms_norm_eps"] == 1e-05 and config["routed_scaling_factor"] == 2.5
    assert config["rope_parameters"] == {"rope_theta": 1000000, "rope_type": "default"}
    assert config["rope_theta"] == 1000000 and config["rope_scaling"] is None
    assert config["scoring_func"] == "sigmoid" and config["topk_method"] == "noaux_tc"
    assert config["eos_token_id"] == [meta["tokenizer.ggml.eos_token_id"], meta["tokenizer.ggml.eot_token_id"],
                                      meta["tokenizer.ggml.eom_token_id"]]
    assert config["tie_word_embeddings"] is False


@pytest.mark.parametrize("key, value, tensor", [
    ("glm-dsa.attention.q_lora_rank", 128, "blk.0.attn_q_a.weight"),
    ("glm-dsa.attention.kv_lora_rank", 448, "blk.0.attn_kv_a_mqa.weight"),
    ("glm-dsa.attention.head_count", 8, "blk.0.attn_q_b.weight"),
    ("glm-dsa.attention.indexer.key_length", 64, "blk.0.indexer.attn_q_b.weight"),
    ("glm-dsa.expert_count", 16, "blk.1.ffn_gate_inp.weight"),
    ("glm-dsa.embedding_length", 512, "token_embd.weight"),
])
def test_metadata_contradicting_shapes(small, key, value, tensor):
    bad = small(f"meta-{key.split('.')[-1]}", metadata_overrides={key: value})
    with pytest.raises(GGUFError) as exc_info:
        build_hf_config(open_gguf(bad.path))
    message = str(exc_info.value)
    assert "\n" not in message and str(bad.path) in message and key in message and tensor in message


def test_block_count_contradicting_blocks(small):
    bad = small("meta-blocks", metadata_overrides={"glm-dsa.block_count": 5})
    with pytest.raises(GGUFError) as exc_info:
        build_hf_config(open_gguf(bad.path))
    assert "glm-dsa.block_count" in str(exc_info.value) and "blk.4.attn_norm.weight" in str(exc_info.value)


def test_missing_key_is_named(small):
    bad = small("meta-missing", metadata_overrides={"glm-dsa.attention.kv_lora_rank": None})
    with pytest.raises(GGUFError) as exc_info:
        build_hf_config(open_gguf(bad.path))
    message = str(exc_info.value)
    assert str(bad.path) in message and "glm-dsa.attention.kv_lora_rank is missing" in message


@pytest.mark.parametrize("key, value, expected", [
    ("glm-dsa.attention.q_lora_rank", "256", "expected an integer, found '256'"),
    ("glm-dsa.expert_weights_norm", 1, "expected a bool, found 1"),
    ("glm-dsa.expert_gating_func", 7, "expected 1 (softmax) or 2 (sigmoid), found 7"),
    ("glm-dsa.rope.freq_base", "fast", "expected a number, found 'fast'"),
])
def test_wrong_value_is_named(small, key, value, expected):
    bad = small(f"meta-value-{key.split('.')[-1]}", metadata_overrides={key: value})
    with pytest.raises(GGUFError) as exc_info:
        build_hf_config(open_gguf(bad.path))
    message = str(exc_info.value)
    assert "\n" not in message and str(bad.path) in message and key in message and expected in message
