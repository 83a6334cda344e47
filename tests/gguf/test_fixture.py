"""The fixture writer: K-quant encoders, llama.cpp layout rules, metadata, reference files, CLI."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest

from glm5_shim.gguf import fixture
from glm5_shim.gguf.errors import GGUFError
from glm5_shim.gguf.kquants import quantize_q4_k, quantize_q6_k
from glm5_shim.gguf.kv_b import rebuild_kv_b, split_kv_b
from glm5_shim.gguf.reader import open_gguf

Q = gguf.GGMLQuantizationType


@pytest.mark.parametrize("encode, qtype, bound", [(quantize_q4_k, Q.Q4_K, 0.08), (quantize_q6_k, Q.Q6_K, 0.02)])
def test_kquant_round_trip_through_gguf_dequantize(encode, qtype, bound):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 5, 512)).astype(np.float32)
    x[0, 0, :256] = 0.0  # an all-zero block must stay exactly zero
    x[1, 1, :256] = np.linspace(-4, 9, 256)  # a skewed block (positive heavy)
    x[2, 2, 256:] *= 0.02  # a block far smaller than its neighbours (still within f16 scale range)
    data = encode(x)
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    assert data.dtype == np.uint8 and data.shape == (3, 5, 512 // block_size * type_size)
    y = gguf.quants.dequantize(data, qtype)
    assert y.shape == x.shape
    np.testing.assert_array_equal(y[0, 0, :256], 0.0)
    blocks_x, blocks_y = x.reshape(-1, 256), y.reshape(-1, 256)
    for bx, by in zip(blocks_x, blocks_y):
        amax = np.abs(bx).max()
        assert np.abs(by - bx).max() <= bound * amax + 1e-12
    # Not a trivially lossless copy: the 4/6-bit grid shows.
    assert np.abs(y - x).max() > 0


def test_q6_k_exact_on_its_own_grid():
    # Values d * scale[j] * (q - 32) with d a power of two, the largest scale 127 and every sub-block
    # reaching |q - 32| = 31 are exactly what the encoder picks, so they must come back bit-exact
    # (which also pins down the position of every value in the packed block).
    d = 2.0 ** -4
    scales = 127 - 8 * np.arange(16)
    rng = np.random.default_rng(5)
    q = rng.integers(-31, 32, size=(16, 16))
    q[:, 0] = 31
    x = (d * scales[:, None] * q).astype(np.float32).reshape(1, 256)
    y = gguf.quants.dequantize(quantize_q6_k(x), Q.Q6_K)
    np.testing.assert_array_equal(y, x)


def test_q4_k_exact_on_its_own_grid():
    # value = d * scale[j] * q - dmin * min[j], q in 0..15, with the largest scale and min both 63 and
    # every sub-block reaching q = 0 and q = 15: exactly representable, so bit-exact after the round trip.
    d, dmin = 2.0 ** -5, 2.0 ** -6
    scales = 63 - 7 * np.arange(8)
    mins = np.array([63, 0, 5, 17, 30, 41, 2, 12])
    rng = np.random.default_rng(6)
    q = rng.integers(0, 16, size=(8, 32))
    q[:, 0], q[:, 1] = 0, 15
    x = (d * scales[:, None] * q - dmin * mins[:, None]).astype(np.float32).reshape(1, 256)
    y = gguf.quants.dequantize(quantize_q4_k(x), Q.Q4_K)
    np.testing.assert_array_equal(y, x)


def test_block_size_fallback_rule():
    k_b = np.zeros((4, 512, 192), np.float32)
    assert fixture.choose_type("blk.0.attn_k_b.weight", k_b, "Q4_K") == "Q5_0"
    assert fixture.choose_type("blk.0.attn_k_b.weight", k_b, "Q6_K") == "Q8_0"
    assert fixture.choose_type("blk.0.attn_k_b.weight", k_b, "Q8_0") == "Q8_0"
    assert fixture.choose_type("blk.0.attn_v_b.weight", np.zeros((4, 256, 512), np.float32), "Q4_K") == "Q4_K"
    assert fixture.choose_type("blk.1.ffn_gate_inp.weight", np.zeros((8, 256), np.float32), "Q4_K") == "F32"
    assert fixture.choose_type("blk.1.attn_norm.weight", np.zeros(256, np.float32), "BF16") == "F32"


def test_kv_b_split_layout_and_inverse():
    config = {"num_attention_heads": 3, "kv_lora_rank": 5, "qk_nope_head_dim": 2, "v_head_dim": 4}
    kv_b = np.arange(3 * 6 * 5, dtype=np.float32).reshape(18, 5)
    k_b, v_b = split_kv_b(kv_b, config)
    assert k_b.shape == (3, 5, 2) and v_b.shape == (3, 4, 5)
    for h in range(3):
        for i in range(2):  # row i of head h's k_nope block, transposed
            np.testing.assert_array_equal(k_b[h, :, i], kv_b[h * 6 + i])
        for i in range(4):  # v rows follow the k_nope rows
            np.testing.assert_array_equal(v_b[h, i], kv_b[h * 6 + 2 + i])
    np.testing.assert_array_equal(rebuild_kv_b(k_b, v_b, config), kv_b)
    with pytest.raises(GGUFError, match=r"blk.7.attn_k_b.weight: expected shape \[3, 5, 2\]"):
        rebuild_kv_b(k_b[:, :4], v_b, config, layer=7, where="model.gguf")


def test_metadata_is_laid_out_like_llama_cpp(q8):
    model = open_gguf(q8.path)
    reader = model.readers[0]
    V = gguf.GGUFValueType
    expected = {
        "general.architecture": ("glm-dsa", V.STRING),
        "glm-dsa.block_count": (4, V.UINT32),
        "glm-dsa.nextn_predict_layers": (1, V.UINT32),
        "glm-dsa.context_length": (8192, V.UINT32),
        "glm-dsa.embedding_length": (256, V.UINT32),
        "glm-dsa.feed_forward_length": (512, V.UINT32),
        "glm-dsa.attention.head_count": (4, V.UINT32),
        "glm-dsa.attention.head_count_kv": (1, V.UINT32),
        "glm-dsa.attention.key_length": (576, V.UINT32),
        "glm-dsa.attention.value_length": (512, V.UINT32),
        "glm-dsa.attention.key_length_mla": (256, V.UINT32),
        "glm-dsa.attention.value_length_mla": (256, V.UINT32),
        "glm-dsa.attention.q_lora_rank": (256, V.UINT32),
        "glm-dsa.attention.kv_lora_rank": (512, V.UINT32),
        "glm-dsa.rope.dimension_count": (64, V.UINT32),
        "glm-dsa.rope.freq_base": (1e6, V.FLOAT32),
        "glm-dsa.attention.layer_norm_rms_epsilon": (np.float32(1e-5), V.FLOAT32),
        "glm-dsa.leading_dense_block_count": (1, V.UINT32),
        "glm-dsa.expert_count": (8, V.UINT32),
        "glm-dsa.expert_used_count": (2, V.UINT32),
        "glm-dsa.expert_shared_count": (1, V.UINT32),
        "glm-dsa.expert_feed_forward_length": (256, V.UINT32),
        "glm-dsa.expert_group_count": (1, V.UINT32),
        "glm-dsa.expert_group_used_count": (1, V.UINT32),
        "glm-dsa.expert_gating_func": (2, V.UINT32),
        "glm-dsa.expert_weights_scale": (2.5, V.FLOAT32),
        "glm-dsa.expert_weights_norm": (True, V.BOOL),
        "glm-dsa.attention.indexer.head_count": (32, V.UINT32),
        "glm-dsa.attention.indexer.key_length": (128, V.UINT32),
        "glm-dsa.attention.indexer.top_k": (128, V.UINT32),
        "glm-dsa.vocab_size": (1600, V.UINT32),
        "general.file_type": (int(gguf.LlamaFileType.MOSTLY_Q8_0), V.UINT32),
        "tokenizer.ggml.model": ("gpt2", V.STRING),
        "tokenizer.ggml.pre": ("glm4", V.STRING),
    }
    for key, (value, vtype) in expected.items():
        field = reader.fields[key]
        assert field.types[0] == vtype, key
        assert model.metadata[key] == pytest.approx(value), key
    tokens = model.metadata["tokenizer.ggml.tokens"]
    types = model.metadata["tokenizer.ggml.token_type"]
    assert len(tokens) == len(types) == 1600
    # llama.cpp's converter: CONTROL for GLM's HF-special tokens and the <|...|> ones, USER_DEFINED for the rest.
    control = {tok for tok, kind in zip(tokens, types) if kind == 3}
    user_defined = {tok for tok, kind in zip(tokens, types) if kind == 4}
    assert control == set(fixture.GLM_HF_SPECIAL_TOKENS) | {"<|code_prefix|>", "<|code_middle|>", "<|code_suffix|>",
                                                            "<|begin_of_box|>", "<|end_of_box|>", "<|image|>",
                                                            "<|video|>"}
    assert user_defined == {"<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>",
                            "</tool_response>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "/nothink"}
    assert len(fixture.GLM_SPECIAL_TOKENS) == 36
    assert 1000 <= sum(kind == 1 for kind in types) <= 2000
    meta = model.metadata
    assert tokens[meta["tokenizer.ggml.bos_token_id"]] == "[gMASK]"
    assert tokens[meta["tokenizer.ggml.eos_token_id"]] == "<|endoftext|>"
    assert tokens[meta["tokenizer.ggml.eot_token_id"]] == "<|user|>"
    assert tokens[meta["tokenizer.ggml.eom_token_id"]] == "<|observation|>"
    assert meta["tokenizer.chat_template"].startswith("[gMASK]<sop>")
    assert all(" " in merge for merge in meta["tokenizer.ggml.merges"])


def test_tensor_layout_is_llama_cpp(q8):
    model = open_gguf(q8.path)
    ne = {name: info.ne for name, info in model.tensors.items()}
    assert ne["blk.0.attn_k_b.weight"] == (192, 512, 4)
    assert ne["blk.0.attn_v_b.weight"] == (512, 256, 4)
    assert ne["blk.1.ffn_gate_exps.weight"] == (256, 256, 8)
    assert ne["blk.1.ffn_down_exps.weight"] == (256, 256, 8)
    assert ne["blk.1.exp_probs_b.bias"] == (8,)
    assert ne["blk.0.attn_kv_a_mqa.weight"] == (256, 576)
    assert ne["blk.3.nextn.eh_proj.weight"] == (512, 256)
    assert "blk.0.attn_kv_b.weight" not in model.tensors


def test_reference_directory(q8):
    weights = q8.weights
    config = q8.config
    assert config["model_type"] == "glm_moe_dsa" and config["num_hidden_layers"] == 3
    assert weights["model.layers.1.mlp.experts.7.down_proj.weight"].shape == (256, 256)
    assert weights["model.layers.0.self_attn.kv_b_proj.weight"].shape == (4 * 448, 512)
    assert weights["model.layers.3.eh_proj.weight"].shape == (256, 512)
    assert "model.layers.3.shared_head.norm.weight" in weights
    assert "model.layers.0.mlp.gate.weight" not in weights and "model.layers.1.mlp.gate_proj.weight" not in weights
    assert all(w.dtype == np.float32 for w in weights.values())
    tokenizer = json.loads((q8.reference / "tokenizer.json").read_text())
    assert tokenizer["model"]["type"] == "BPE"
    assert [t["content"] for t in tokenizer["added_tokens"]] == list(fixture.GLM_SPECIAL_TOKENS)


def test_same_seed_same_bytes(tiny, small):
    a = small("good")
    b = tiny("small-good-again", layers=2, index_heads=4)
    assert a.path.read_bytes() == b.path.read_bytes()
    c = tiny("small-seed-1", layers=2, index_heads=4, seed=1)
    assert a.path.read_bytes() != c.path.read_bytes()


def test_cli_make_tiny(tmp_path, capsys):
    out = tmp_path / "cli.gguf"
    assert fixture.main(["make-tiny", str(out), "--quant", "Q4_0", "--layers", "2", "--shards", "2", "--heads", "2",
                         "--index-heads", "4", "--index-topk", "32", "--no-mtp", "--seed", "3"]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(tmp_path / "cli-00001-of-00002.gguf"), str(tmp_path / "cli-00002-of-00002.gguf"),
                       str(tmp_path / "cli.reference")]
    model = open_gguf(printed[0])
    assert model.metadata["glm-dsa.block_count"] == 2 and model.metadata["glm-dsa.nextn_predict_layers"] == 0
    assert model.metadata["glm-dsa.attention.indexer.top_k"] == 32
    assert model.tensors["blk.1.attn_q_b.weight"].type_name == "Q4_0"
    assert fixture.main(["make-tiny", str(tmp_path / "bad.gguf"), "--layers", "1"]) == 2


def _safetensors(path):
    from safetensors.numpy import load_file

    return load_file(str(path / "model.safetensors"))


@pytest.mark.parametrize("quant, bound", [("F32", 0.0), ("Q8_0", 0.01)])
def test_dequantized_reference_is_what_the_gguf_stores(tmp_path, quant, bound):
    """reference='dequantized' holds the GGUF's values under HF names: equal to the float weights for F32 (the
    inverse mapping, kv_b rebuild and expert unstacking are exact), within the type's rounding for Q8_0, and equal
    to the file's own decoded tensors."""
    kw = dict(quant=quant, layers=2, heads=4, index_heads=4, mtp=False)
    fixture.make_tiny(tmp_path / "f.gguf", **kw)
    fixture.make_tiny(tmp_path / "d.gguf", reference="dequantized", **kw)
    floats, stored = _safetensors(tmp_path / "f.reference"), _safetensors(tmp_path / "d.reference")
    assert stored.keys() == floats.keys()
    for name, w in floats.items():
        err = np.abs(stored[name] - w).max() / max(np.abs(w).max(), 1e-12)
        assert err <= bound, (name, err)
    if quant == "Q8_0":
        assert any(not np.array_equal(stored[n], floats[n]) for n in floats), "Q8_0 rounding must show"
        reader = open_gguf(tmp_path / "d.gguf")
        t = reader.tensors["blk.1.ffn_down_exps.weight"]
        decoded = gguf.quants.dequantize(t.data, t.ggml_type)
        np.testing.assert_array_equal(stored["model.layers.1.mlp.experts.3.down_proj.weight"], decoded[3])


def test_peaked_weights_scale_the_residual_writers_and_add_a_bigram_head():
    config = fixture.tiny_hf_config(layers=2, heads=4, index_heads=4, index_topk=128, mtp=False,
                                    tokenizer=fixture.tiny_tokenizer())
    plain = fixture.random_hf_weights(config, 0)
    ordinary = list(range(100, 200))
    peaked = fixture.random_hf_weights(config, 0, residual_scale=0.05, bigram_gain=1.0, bigram_tokens=ordinary)
    for name in ("model.layers.0.self_attn.o_proj.weight", "model.layers.0.mlp.down_proj.weight",
                 "model.layers.1.mlp.experts.2.down_proj.weight", "model.layers.1.mlp.shared_experts.down_proj.weight"):
        np.testing.assert_allclose(peaked[name], 0.05 * plain[name], rtol=1e-6)
    np.testing.assert_array_equal(peaked["model.layers.0.self_attn.q_b_proj.weight"],
                                  plain["model.layers.0.self_attn.q_b_proj.weight"])
    delta = peaked["lm_head.weight"] - plain["lm_head.weight"]
    changed = np.flatnonzero(np.abs(delta).sum(1) > 0)
    assert sorted(changed) == ordinary  # only ordinary tokens are targets of the bigram
    embed = plain["model.embed_tokens.weight"]
    # each changed lm_head row is the embedding of exactly one ordinary token, a permutation
    sources = [int(np.argmin(np.abs(embed[ordinary] - delta[r]).sum(1))) for r in changed]
    assert sorted(sources) == list(range(len(ordinary)))
    np.testing.assert_allclose(delta[changed[0]], embed[ordinary[sources[0]]], rtol=1e-5, atol=1e-7)


def test_make_tiny_refuses_an_unknown_reference_kind(tmp_path):
    with pytest.raises(ValueError, match="reference 'nope'"):
        fixture.make_tiny(tmp_path / "x.gguf", reference="nope")


def test_split_mtp_files(tmp_path):
    """split_mtp writes the converter's --no-mtp / --mtp files of the whole model (checked byte for byte against the
    real converter in test_llama_tools_real.py); the reference is the whole checkpoint either way."""
    kw = dict(quant="Q8_0", layers=2, index_heads=4, write_reference=False)
    whole = open_gguf(fixture.make_tiny(tmp_path / "whole.gguf", **kw)[0])
    trunk = open_gguf(fixture.make_tiny(tmp_path / "trunk.gguf", split_mtp="trunk", **kw)[0])
    draft = open_gguf(fixture.make_tiny(tmp_path / "mtp.gguf", split_mtp="mtp", **kw)[0])
    stripped = open_gguf(fixture.make_tiny(tmp_path / "stripped.gguf", split_mtp="stripped", **kw)[0])
    names = list(whole.tensors)
    assert list(trunk.tensors) == list(stripped.tensors) == [n for n in names if not n.startswith("blk.2.")]
    assert list(draft.tensors) == [n for n in names if n.startswith("blk.2.") or not n.startswith("blk.")]
    for model, blocks in ((trunk, 2), (draft, 3), (stripped, 3)):
        for key, value in whole.metadata.items():
            if key == "glm-dsa.block_count":
                assert model.metadata[key] == blocks
            elif key == "glm-dsa.nextn_predict_layers" and model is trunk:
                assert key not in model.metadata
            elif key != "general.size_label":  # the parameter count of the tensors written
                assert model.metadata[key] == value, key
    fixture.make_tiny(tmp_path / "with-ref.gguf", split_mtp="mtp", quant="Q8_0", layers=2, index_heads=4)
    config = json.loads((tmp_path / "with-ref.reference" / "config.json").read_text())
    assert config["num_nextn_predict_layers"] == 1
    assert "model.layers.0.input_layernorm.weight" in _safetensors(tmp_path / "with-ref.reference")


def test_split_mtp_arguments(tmp_path, capsys):
    with pytest.raises(ValueError, match="split_mtp 'both'"):
        fixture.make_tiny(tmp_path / "x.gguf", split_mtp="both")
    with pytest.raises(ValueError, match="needs the MTP block"):
        fixture.make_tiny(tmp_path / "x.gguf", split_mtp="mtp", mtp=False)
    out = tmp_path / "cli.gguf"
    assert fixture.main(["make-tiny", str(out), "--layers", "2", "--index-heads", "4", "--split-mtp", "trunk"]) == 0
    capsys.readouterr()
    model = open_gguf(out)
    assert model.metadata["glm-dsa.block_count"] == 2 and "glm-dsa.nextn_predict_layers" not in model.metadata
