"""The longest --max-model-len per GPU (glm5_shim.gguf.memory): GLM-5.2's real dimensions against numbers worked out
here by hand from vLLM 0.23.0's allocation sites, the edge cases, and inspect on a tiny GLM-5.2-style GGUF."""
from __future__ import annotations

import json
import math

import pytest

from glm5_shim import report as gguf_inspect
from glm5_shim.gguf import memory

GIB, MIB = 1 << 30, 1 << 20
ONE_M = 1 << 20

# GLM-5.2: GLM-5's widths, 1M context, the DSA indexer in 21 of 78 layers (0, 1, then every fourth from 2).
GLM52_TYPES = ["full" if i < 2 or (i - 2) % 4 == 0 else "shared" for i in range(78)]
GLM52 = dict(num_hidden_layers=78, kv_lora_rank=512, qk_rope_head_dim=64, index_head_dim=128, index_topk=2048,
             num_attention_heads=64, max_position_embeddings=ONE_M, indexer_rope_interleave=True,
             indexer_types=GLM52_TYPES)
# vllm serve on a 96 GiB GPU, vLLM 0.23.0: --max-num-seqs 1024, --max-num-batched-tokens 8192, utilization 0.92,
# FULL decode graphs up to min(2 * 1024, 512) tokens.
SEQS, TOKENS, CAPTURE = 1024, 8192, 512
BUDGET = math.ceil(96 * GIB * 0.92)
RESERVE = 4 * GIB
FIXED = RESERVE + ONE_M * 64 * 2 + TOKENS * 2048 * 4 + MIB  # rope cache (one), top-k buffer, radix top-k workspace
# bytes per token of --max-model-len besides the KV cache: indexer gather 40 x 132, decode logits fp32 for
# 1024 + 512 tokens, expanded block table 8192 x 4 / 64, block table 1024 x 4 / 64
PER_TOKEN_BUFFERS = 40 * 132 + 4 * (SEQS + CAPTURE) + 8192 * 4 // 64 + 1024 * 4 // 64


def test_glm52_layout_in_the_config():
    assert sum(t == "full" for t in GLM52_TYPES) == 21
    assert memory.indexer_layers(GLM52) == 21
    assert memory.indexer_layers(GLM52, shim=False) == 78
    assert memory.indexer_layers({**GLM52, "indexer_types": None}) == 78


def test_kv_cache_per_token_glm52():
    assert memory.mla_bytes_per_token(GLM52, "bf16") == (512 + 64) * 2 == 1152
    assert memory.mla_bytes_per_token(GLM52, "fp8_ds_mla") == 512 + 4 * 4 + 64 * 2 == 656
    assert memory.indexer_bytes_per_token(GLM52) == 128 + 4 == 132
    # with the shim: MLA in all 78 layers, indexer keys in the 21 full ones
    assert memory.kv_bytes_per_token(GLM52, "bf16") == 78 * 1152 + 21 * 132 == 92628
    assert memory.kv_bytes_per_token(GLM52, "fp8_ds_mla") == 78 * 656 + 21 * 132 == 53940
    # stock vLLM 0.23 keeps an indexer cache in every layer
    assert memory.kv_bytes_per_token(GLM52, "fp8_ds_mla", 78) == 78 * (656 + 132) == 61464
    kv = gguf_inspect.kv_cache_bytes_per_token(GLM52)
    assert kv["indexer_layers"] == 21 and kv["layers"] == 78
    assert (kv["total_bf16"], kv["total_fp8_ds_mla"]) == (92628, 53940)
    with pytest.raises(ValueError):
        memory.mla_bytes_per_token(GLM52, "fp8_e4m3")


def test_serve_defaults():
    assert memory.ServeAssumptions().seqs() == SEQS and memory.ServeAssumptions().batched_tokens() == TOKENS
    assert memory.ServeAssumptions().cudagraph_decode_tokens() == CAPTURE
    small = memory.ServeAssumptions(gpu_bytes=48 * GIB)
    assert (small.seqs(), small.batched_tokens(), small.cudagraph_decode_tokens()) == (256, 2048, 256)
    assert memory.ServeAssumptions(max_num_seqs=64).cudagraph_decode_tokens() == 64
    assert memory.ServeAssumptions(cuda_graphs=False).cudagraph_decode_tokens() == 0
    assert memory.ServeAssumptions().budget_bytes() == BUDGET


def test_memory_needed_at_1m_glm52():
    need = memory.memory_needed(GLM52, ONE_M, "fp8_ds_mla", weight_bytes=50 * GIB, tp=8)
    assert need["weights"] == 50 * GIB and need["reserve"] == 4 * GIB
    assert need["kv_cache"] == ONE_M * 53940                             # 50.2 GiB
    assert need["workspace"] == 40 * ONE_M * 128 + 40 * ONE_M * 4 + MIB  # 5.16 GiB + the radix top-k MiB
    assert need["decode_logits"] == (1024 + 512) * ONE_M * 4             # 6 GiB
    assert need["indexer_block_table"] == 8192 * (ONE_M // 64) * 4 == 512 * MIB
    assert need["block_table"] == 1024 * (ONE_M // 64) * 4 == 64 * MIB
    assert need["rope_cache"] == ONE_M * 64 * 2 == 128 * MIB
    assert need["topk_buffer"] == 8192 * 2048 * 4 == 64 * MIB
    assert need["total"] == sum(v for k, v in need.items() if k != "total")
    bf16 = memory.memory_needed(GLM52, ONE_M, "bf16", weight_bytes=50 * GIB, tp=8)
    assert bf16["kv_cache"] == ONE_M * 92628 and bf16["total"] - need["total"] == ONE_M * (92628 - 53940)
    # a length that is not a whole number of 64-token blocks takes whole blocks of KV cache and of block tables
    odd = memory.memory_needed(GLM52, 1000, "bf16", weight_bytes=0)
    assert odd["kv_cache"] == 1024 * 92628 and odd["block_table"] == 1024 * 16 * 4
    assert odd["decode_logits"] == 1536 * 1000 * 4 and odd["workspace"] == 40 * 1000 * 128 + 40 * 1000 * 4 + MIB
    # stock vLLM: 57 more indexer caches
    stock = memory.memory_needed(GLM52, ONE_M, "fp8_ds_mla", 50 * GIB, 8, memory.ServeAssumptions(shim=False))
    assert stock["kv_cache"] - need["kv_cache"] == ONE_M * 57 * 132
    # eager: no CUDA-graph copy of the decode logits
    eager = memory.memory_needed(GLM52, ONE_M, "fp8_ds_mla", 50 * GIB, 8, memory.ServeAssumptions(cuda_graphs=False))
    assert eager["decode_logits"] == 1024 * ONE_M * 4


def test_native_flashmla_workspace_shares_the_indexer_buffer():
    native = memory.ServeAssumptions(native_flashmla=True)
    fp8 = memory.memory_needed(GLM52, ONE_M, "fp8_ds_mla", 0, 8, native)
    # q_concat [8192 tokens, 64 / 8 heads, 576] bf16 + the [5 L, 576] bf16 prefill workspace: larger than the
    # indexer's 40 L x 132, so it is the one buffer
    assert fp8["workspace"] == 8192 * 8 * 576 * 2 + 5 * ONE_M * 576 * 2
    # bf16 KV: no prefill workspace; q_concat alone (72 MiB at TP 8) is below the indexer's gather
    assert memory.memory_needed(GLM52, ONE_M, "bf16", 0, 8, native)["workspace"] == 40 * ONE_M * 132 + MIB
    assert memory.memory_needed(GLM52, 1024, "bf16", 0, 1, native)["workspace"] == 8192 * 64 * 576 * 2


def _expected_longest(weights: int, kv_per_token: int, context: int = ONE_M) -> int:
    """By hand: everything is linear in L for whole 1024-token steps (the rope cache follows the context)."""
    free = BUDGET - weights - FIXED + (ONE_M - context) * 64 * 2
    return free // (kv_per_token + PER_TOKEN_BUFFERS) // 1024 * 1024


@pytest.mark.parametrize("weights_gib", [53.2, 60.0, 80.0])
def test_longest_context_glm52_on_96gib(weights_gib):
    weights = int(weights_gib * GIB)
    for kv_dtype, per_token in (("fp8_ds_mla", 53940), ("bf16", 92628)):
        fit = memory.longest_context(GLM52, weights, kv_dtype, tp=8)
        expected = _expected_longest(weights, per_token)
        assert fit.max_model_len == expected and not fit.capped, (kv_dtype, fit)
        # the boundary: L fits, L + 1024 does not
        assert memory.memory_needed(GLM52, expected, kv_dtype, weights, 8)["total"] <= BUDGET
        assert memory.memory_needed(GLM52, expected + 1024, kv_dtype, weights, 8)["total"] > BUDGET
    # ~53 GiB a GPU (a ~450 GB Q4_K_M at TP 8): about half a million tokens with fp8_ds_mla
    if weights_gib == 53.2:
        assert 490_000 < memory.longest_context(GLM52, weights, "fp8_ds_mla", 8).max_model_len < 520_000


def test_longest_context_edges():
    # weights alone too big
    fit = memory.longest_context(GLM52, 105 * GIB, "fp8_ds_mla", tp=4)
    assert fit.max_model_len is None and "weights 105.0 GiB + reserve 4 GiB > 88.3 GiB usable" in fit.why
    # the weights fit, but not 1024 tokens more
    almost = BUDGET - FIXED - 1024 * (53940 + PER_TOKEN_BUFFERS) + 1  # one byte short of 1024 tokens
    assert memory.memory_needed(GLM52, 1024, "fp8_ds_mla", almost)["total"] == BUDGET + 1
    fit = memory.longest_context(GLM52, almost, "fp8_ds_mla")
    assert fit.max_model_len is None and "less than 1024 tokens need" in fit.why
    # small weights: capped at the model's context_length, exactly
    fit = memory.longest_context(GLM52, 1 * GIB, "fp8_ds_mla")
    assert fit.max_model_len == ONE_M and fit.capped
    assert memory.longest_context(GLM52, 1 * GIB, "bf16").max_model_len == _expected_longest(GIB, 92628) < ONE_M
    # a context_length that is not a multiple of 1024: the cap itself when it fits, a multiple of 1024 below when not
    odd = {**GLM52, "max_position_embeddings": 200_000}
    assert memory.longest_context(odd, 1 * GIB, "bf16").max_model_len == 200_000
    fit = memory.longest_context(odd, 80 * GIB, "bf16")
    assert fit.max_model_len == _expected_longest(80 * GIB, 92628, 200_000) < 200_000 and not fit.capped
    # a bigger reserve or a smaller GPU: less context
    base = memory.longest_context(GLM52, 53 * GIB, "fp8_ds_mla").max_model_len
    assert memory.longest_context(GLM52, 53 * GIB, "fp8_ds_mla",
                                  assume=memory.ServeAssumptions(reserve_bytes=8 * GIB)).max_model_len < base
    assert memory.longest_context(GLM52, 53 * GIB, "fp8_ds_mla",
                                  assume=memory.ServeAssumptions(max_num_seqs=256)).max_model_len > base


def test_context_table_and_lines():
    weights = {1: 418 * GIB, 2: 210 * GIB, 4: 105 * GIB, 8: int(53.2 * GIB)}
    table = memory.context_table(GLM52, weights)
    json.dumps(table)
    assert [r["tp"] for r in table["rows"]] == [1, 2, 4, 8]
    assert table["rows"][0]["bf16"] is None and "weights 418.0 GiB" in table["rows"][0]["why"]
    assert table["rows"][3]["fp8_ds_mla"] == _expected_longest(weights[8], 53940)
    assert table["kv_bytes_per_token"] == {"bf16": 92628, "fp8_ds_mla": 53940}
    lines = memory.format_context_table(table)
    assert lines[0].startswith("longest --max-model-len, one sequence (96 GiB GPUs, --gpu-memory-utilization 0.92")
    assert lines[1] == "  TP1: does not fit (weights 418.0 GiB + reserve 4 GiB > 88.3 GiB usable)"
    assert lines[4] == (f"  TP8: bf16 KV {_expected_longest(weights[8], 92628)}, "
                        f"fp8_ds_mla KV {_expected_longest(weights[8], 53940)}")


# --- inspect on a tiny GLM-5.2-style file: 7 layers, F F F S S S F, 1M context ---------------------------------------
@pytest.fixture(scope="module")
def glm52(tiny):
    return tiny("glm52-7", layers=7, indexer_types="glm52", context_length=ONE_M)


def test_inspect_tiny_glm52(glm52):
    report = gguf_inspect.inspect_report(glm52.path)
    assert report["findings"] == []
    assert report["indexer_layout"]["pattern"] == "FFFSSSF"
    assert (report["indexer_layout"]["full_layers"], report["indexer_layout"]["shared_layers"]) == (4, 3)
    kv = report["kv_cache_bytes_per_token"]
    assert kv["indexer_layers"] == 4 and kv["layers"] == 7
    assert kv["total_bf16"] == 7 * 1152 + 4 * 132 and kv["total_fp8_ds_mla"] == 7 * 656 + 4 * 132
    rows = report["longest_context"]["rows"]
    assert [(r["tp"], r["bf16"], r["fp8_ds_mla"]) for r in rows] == [(tp, ONE_M, ONE_M) for tp in (1, 2, 4, 8)]
    text = gguf_inspect.format_report(report)
    assert "DSA indexer: F F F S S S F (4 full, 3 shared" in text
    assert "KV cache per token (same on every TP rank): bf16 8592 B, fp8_ds_mla 5120 B" in text
    assert "  TP8: bf16 KV 1048576 (model max), fp8_ds_mla KV 1048576 (model max)" in text


def test_inspect_cli_memory_flags(glm52, capsys):
    assert gguf_inspect.main([str(glm52.path), "--gpu-memory", "4"]) == 0
    out = capsys.readouterr().out
    assert "(4 GiB GPUs, --gpu-memory-utilization 0.92, --max-num-seqs 256, --max-num-batched-tokens 2048" in out
    assert "TP1: does not fit (weights 0.0 GiB + reserve 4 GiB > 3.7 GiB usable)" in out
    assert gguf_inspect.main([str(glm52.path), "--gpu-memory", "8", "--reserve", "1", "--max-num-seqs", "8",
                              "--json"]) == 0
    table = json.loads(capsys.readouterr().out)["longest_context"]
    assert table["assumptions"]["gpu_bytes"] == 8 * GIB and table["assumptions"]["max_num_seqs"] == 8
    assert table["assumptions"]["reserve_bytes"] == GIB


def test_shared_layer_indexer_weights_are_not_counted(tiny, glm52):
    """Some GLM-5.2 GGUFs carry indexer tensors in shared layers too; the loader skips them, so do the weights."""
    carrying = tiny("glm52-7-carrying", layers=7, indexer_types="glm52", context_length=ONE_M,
                    shared_indexer_weights=True)
    plain = gguf_inspect.inspect_report(glm52.path)
    report = gguf_inspect.inspect_report(carrying.path)
    assert report["tensor_count"] == plain["tensor_count"] + 3 * 5
    assert report["weight_bytes_per_gpu"] == plain["weight_bytes_per_gpu"]
    assert report["kv_cache_bytes_per_token"] == plain["kv_cache_bytes_per_token"]


def test_what_grows_with_the_context_matches_the_h200_measurement(tmp_path):
    """bench/journal/ (2026-12-01, long context): a 7-layer GLM-5.2-style model served with --max-num-seqs 64 on the
    H200 (vllm serve's defaults there: 8192 batched tokens).  From --max-model-len 131072 to 1048576 vLLM's KV pool
    shrank by 4.72 GiB (shim; 4.73 native), of which the CUDA-graph pool took 0.22 GiB (0.12 -> 0.34): the indexer
    prefill workspace and the FULL decode graph's logits, the two L-dependent buffers vLLM counts before sizing the
    KV cache."""
    from glm5_shim.gguf.config import build_hf_config
    from glm5_shim.gguf.fixture import make_tiny
    from glm5_shim.gguf.reader import open_gguf

    path = make_tiny(tmp_path / "glm52.gguf", layers=7, heads=16, indexer_types="glm52", context_length=1 << 20,
                     write_reference=False)[0]
    config = build_hf_config(open_gguf(path))
    assume = memory.ServeAssumptions(gpu_bytes=140 * GIB, max_num_seqs=64)
    short, long = (memory.memory_needed(config, n, "bf16", 0, assume=assume) for n in (131072, 1 << 20))
    graph = 64 * ((1 << 20) - 131072) * 4  # the FULL decode graph's [64, L] fp32 logits
    counted = long["workspace"] - short["workspace"] + graph
    assert abs(counted / GIB - 4.72) < 0.03
    assert abs(graph / GIB - 0.22) < 0.01
    # and the per-token KV cache: 8592 B measured (7 x 1152 MLA + 4 full layers x 132), 8988 B with every layer full
    assert memory.kv_bytes_per_token(config, "bf16") == 8592
    assert memory.kv_bytes_per_token(config, "bf16", 7) == 8988
