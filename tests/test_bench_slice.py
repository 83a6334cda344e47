"""bench/slice_serve.py and bench/projection.py on the CPU: vLLM 0.23's start-up lines parsed, kernel names
classified, a chrome trace grouped per step, the decode window, the log-prob comparison, the projection's arithmetic,
and a whole part against the stand-in server (tests/fake_openai_server.py through tests/fake_launch.sh)."""
from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path

import pytest

from tests.helpers import REPO, bench_module

slice_serve = bench_module("slice_serve")  # puts bench/ on sys.path: slice_parts and e2e_parts import below
projection = bench_module("projection")

from e2e_parts.vllm_log import kept_lines, startup_numbers  # noqa: E402
from slice_parts import kernels, measure, parts  # noqa: E402
from slice_parts.report import report  # noqa: E402
from slice_parts.weights import plan_groups, weight_groups  # noqa: E402

FIXTURE = REPO / "tests" / "fixtures" / "slice_example.json"


def test_startup_lines_of_vllm_0_23_are_parsed():
    # each line formatted with vLLM 0.23.0's own format string (source file and line in e2e_parts/vllm_log.py)
    log = "\n".join([
        "(EngineCore pid=12) INFO 12-02 10:00:01 [gpu_model_runner.py:5188] Model loading took %s GiB memory and "
        "%.6f seconds" % ("2.38", 4.5),
        "(EngineCore pid=12) INFO 12-02 10:00:09 [gpu_worker.py:481] Available KV cache memory: %s GiB" % "110.5",
        "(EngineCore pid=12) INFO 12-02 10:00:09 [kv_cache_utils.py:1744] GPU KV cache size: %s tokens"
        % f"{21458944:,}",
        "(EngineCore pid=12) INFO 12-02 10:00:20 [gpu_model_runner.py:6586] Graph capturing finished in %.0f secs, "
        "took %.2f GiB" % (11.4, 0.62),
        "(EngineCore pid=12) INFO 12-02 10:00:20 [core.py:307] init engine (profile, create kv cache, warmup model) "
        "took %.2f s (compilation: %.2f s)" % (18.4, 9.1),
        "(APIServer pid=1) INFO 12-02 10:00:30 [api_server.py:1] Starting vLLM API server 0 on http://0.0.0.0:8400",
    ])
    n = startup_numbers(log)
    assert n["weights_gib"] == 2.38 and n["load_s"] == 4.5
    assert n["available_kv_gib"] == 110.5 and n["kv_tokens"] == 21458944
    assert n["graphs_gib"] == 0.62 and n["graphs_s"] == 11
    assert n["init_engine_s"] == 18.4 and n["compile_s"] == 9.1
    assert n["kv_bytes_per_token"] == round(110.5 * 2**30 / 21458944, 1)
    kept = kept_lines(log)
    assert len(kept) == 5 and kept[0].startswith("Model loading took 2.38 GiB")
    # without compilation the init line has no parenthesis; the number is still found
    line = "init engine (profile, create kv cache, warmup model) took 7.25 s"
    assert startup_numbers(line) == {"init_engine_s": 7.25}


@pytest.mark.parametrize("name,group", [
    ("_moe_kernel", "gguf_moe"), ("_linear_kernel", "gguf_dense"), ("_dequant_kernel", "gguf_dense"),
    ("void moe_q4_K<c10::BFloat16, false>(void const*, void const*)", "gguf_moe"),
    ("void moe_vec_q<c10::BFloat16, 256, 32, 4>(...)", "gguf_moe"),
    ("void mul_mat_vec_q<c10::BFloat16, 256, 32, 4, block_q4_K>(...)", "gguf_dense"),
    ("void mul_mat_q4_K<c10::BFloat16, false>(...)", "gguf_dense"),
    ("void quantize_q8_1<c10::BFloat16>(c10::BFloat16 const*, void*, int, int)", "gguf_dense"),
    ("void vllm::moe::topkGatingSoftmax<8, 256>(...)", "gguf_moe"),
    ("void vllm::moe::grouped_topk_fused_kernel<float>(...)", "gguf_moe"),
    ("_sparse_mla_fwd_kernel", "attention"), ("_sparse_mla_combine_kernel", "attention"),
    ("_convert_kernel", "attention"),
    ("void flash::flash_fwd_splitkv_mla_kernel<...>(...)", "attention"),
    ("void vllm::concat_and_cache_ds_mla_kernel<...>(...)", "attention"),
    ("void get_mla_metadata_kernel<64>(...)", "attention"), ("_sparse_mla_fwd_kernel_0d1d2d3d", "attention"),
    ("void sm90::fwd::sparse_attn_fwd_kernel<...>(...)", "attention"),
    ("void vllm::moe::group_idx_and_topk_idx_kernel<float>(...)", "gguf_moe"),
    ("void vllm::moe_align_block_size_kernel<int>(...)", "gguf_moe"),
    ("_mqa_logits_kernel", "indexer"), ("_paged_mqa_logits_kernel", "indexer"), ("_fill_outside_kernel", "indexer"),
    ("void deep_gemm::sm90_fp8_paged_mqa_logits<64, 128>(...)", "indexer"),
    ("void vllm::indexer_k_quant_and_cache_kernel<...>(...)", "indexer"),
    ("void vllm::top_k_per_row_decode<...>(...)", "indexer"),
    ("void vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>(...)", "norm_rope_act"),
    ("void vllm::rotary_embedding_kernel<c10::BFloat16, true>(...)", "norm_rope_act"),
    ("void vllm::act_and_mul_kernel<...>(...)", "norm_rope_act"),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_3", "norm_rope_act"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>>>",
     "sampling"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, LogSoftMaxForwardEpilogue>",
     "sampling"),
    # the native arm (FlashMLA sparse on sm90, DeepGEMM, vLLM's sparse-MLA index conversion) and vLLM's GGUF kernels
    ("void sm90::fwd::sparse_attn_fwd_kernel<sm90::fwd::KernelTemplate<512, false>, ...>(...)", "attention"),
    ("void sm90::decode::sparse_fp8::flash_fwd_splitkv_mla_fp8_sparse_kernel<...>(...)", "attention"),
    ("void smxx::decode::flash_fwd_mla_combine_kernel<cutlass::bfloat16_t, 512, 8, 64, 256>(...)", "attention"),
    ("void smxx::decode::get_mla_metadata_kernel(GetDecodeSchedMetaParams)", "attention"),
    ("_convert_req_index_to_global_index_kernel", "attention"),
    ("void vllm::concat_mla_q_kernel<__nv_bfloat16>(...)", "attention"),
    ("void deep_gemm::sm90_fp8_mqa_logits<128, 64, 4>(...)", "indexer"),
    ("void deep_gemm::smxx_paged_mqa_logits_metadata<2, 64>(...)", "indexer"),
    ("void vllm::cp_gather_indexer_k_quant_cache_kernel<8>(...)", "indexer"),
    ("void per_token_group_quant_8bit_kernel<c10::BFloat16, c10::Float8_e4m3fn, false, true, float>(...)",
     "indexer"),
    ("void vllm::moe::moeSoftmax<256, __nv_bfloat16>(...)", "gguf_moe"),
    ("void moe_q4_K<c10::BFloat16, true>(void const*, void const*, ...)", "gguf_moe"),
    ("void moe_vec_q<c10::BFloat16, 256, 8, block_iq2_xxs, 1, &vec_dot_iq2_xxs_q8_1>(...)", "gguf_moe"),
    ("void mul_mat_vec_q<c10::BFloat16, 256, 8, block_iq2_s, 1, &vec_dot_iq2_s_q8_1>(...)", "gguf_dense"),
    ("void dequantize_block_q4_K<c10::BFloat16>(void const*, c10::BFloat16*)", "gguf_dense"),
    ("nvjet_tst_128x64_64x8_1x1_v_bz_TNT", "other"), ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", "other"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, ...>", "other"),
])
def test_kernel_names_fall_in_their_groups(name, group):
    assert kernels.classify(name) == group


def test_other_kernels_are_split_by_kind():
    assert kernels.other_kind("nvjet_tst_128x64_64x8_1x1_v_bz_TNT") == "gemm (cuBLAS/CUTLASS)"
    assert kernels.other_kind("ncclDevKernel_AllReduce_Sum_bf16_RING_LL") == "all-reduce"
    assert kernels.other_kind("void at::native::vectorized_elementwise_kernel<4, FillFunctor>") == "copy/fill"


def _ev(cat, name, ts, dur, tid=1, corr=None):
    e = {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid}
    if corr is not None:
        e["args"] = {"correlation": corr}
    return e


def synthetic_trace() -> dict:
    """Two decode steps; in the second, a cuBLAS gemm is launched from inside the shim's GGUF linear op (the
    dequantize-then-gemm prefill path) and must count as GGUF dense; a gemm launched outside stays "other"."""
    ev = [
        _ev("user_annotation", "execute_context_0(0)_generation_4(4)", 0, 100),
        _ev("cuda_runtime", "cudaGraphLaunch", 5, 3, corr=1),
        _ev("kernel", "_moe_kernel", 20, 40, tid=7, corr=1),
        _ev("kernel", "_sparse_mla_fwd_kernel", 60, 10, tid=7, corr=1),
        _ev("kernel", "nvjet_tst_64x8_64x16_4x1_v_bz_TNT", 70, 5, tid=7, corr=1),
        _ev("user_annotation", "execute_context_0(0)_generation_4(4)", 200, 100),
        _ev("cpu_op", "vllm::glm5_gguf_linear", 205, 20),
        _ev("cuda_runtime", "cudaLaunchKernel", 210, 2, corr=2),
        _ev("cuda_runtime", "cudaLaunchKernel", 215, 2, corr=3),
        _ev("kernel", "_dequant_kernel", 230, 6, tid=7, corr=2),
        _ev("kernel", "nvjet_tst_256x128_64x4_1x2_h_bz_coopA_NNT", 240, 30, tid=7, corr=3),
        _ev("cuda_runtime", "cudaLaunchKernel", 260, 2, corr=4),
        _ev("kernel", "void at::native::reduce_kernel<ArgMaxOps<float>>", 280, 4, tid=7, corr=4),
        _ev("kernel", "_paged_mqa_logits_kernel", 290, 12, tid=7, corr=4),
        {"ph": "i", "cat": "instant", "name": "ignored", "ts": 1},
    ]
    return {"traceEvents": ev}


def test_a_trace_is_grouped_per_step(tmp_path):
    g = kernels.group_trace(synthetic_trace())
    assert g["steps"] == 2 and g["kernels"] == 7
    assert g["kernel_us"] == {"gguf_moe": 40.0, "gguf_dense": 36.0, "attention": 10.0, "indexer": 12.0,
                              "norm_rope_act": 0.0, "sampling": 4.0, "other": 5.0}
    assert g["per_step_us"]["gguf_dense"] == 18.0 and g["per_step_us"]["gguf_moe"] == 20.0
    assert g["total_us"] == 107.0 and g["gpu_span_us"] == 302 - 20
    assert g["other_kinds"] == {"gemm (cuBLAS/CUTLASS)": 5.0}
    assert g["top"]["gguf_dense"][0] == ["nvjet_tst_256x128_64x4_1x2_h_bz_coopA_NNT", 30.0, 1]
    # the host side: the step annotations' time, and the CUDA calls a step by name, most time first
    assert g["host_step_us"] == 100.0
    assert g["runtime_per_step"] == {"cudaLaunchKernel": [3.0, 1.5], "cudaGraphLaunch": [1.5, 0.5]}
    # the file forms vLLM's profiler writes (gzip) load the same
    path = tmp_path / "dp0_pp0_tp0.123.pt.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(synthetic_trace(), f)
    assert kernels.newest_trace(tmp_path) == path
    assert kernels.group_trace(kernels.load_trace(path)) == g


SUM_F32 = "void at::native::reduce_kernel<128, 4, at::native::ReduceOp<float, at::native::func_wrapper_t<float, " \
          "at::native::sum_functor<float, float, float>::operator()>>>"
SUM_BF16 = SUM_F32.replace("<float, at", "<c10::BFloat16, at")
COPY = "void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda(...)>"


def test_kernels_in_a_cuda_graph_are_placed_by_their_neighbours():
    """One graph launch, no CPU op around the kernels: quantize_q8_1 goes with the GGUF kernel it feeds (MoE or
    dense), the split-K sum and copy after the shim's _linear_kernel are GGUF dense, the top-k sum after its
    _moe_kernel is GGUF MoE; the same sum or copy elsewhere, or on another stream, stays "other"."""
    names = ["void quantize_q8_1<c10::BFloat16>(...)", "void moe_vec_q<c10::BFloat16, 256>(...)",
             "void quantize_q8_1<c10::BFloat16>(...)", "void mul_mat_vec_q<c10::BFloat16, 256>(...)",
             "_linear_kernel", SUM_F32, COPY, COPY,
             "_moe_kernel", SUM_BF16, COPY,
             "rms_norm_kernel", SUM_F32]
    ev = [_ev("cuda_runtime", "cudaGraphLaunch", 0, 2, corr=1)]
    ev += [_ev("kernel", n, 10 + 10 * i, 1, tid=7, corr=1) for i, n in enumerate(names)]
    ev.append(_ev("kernel", SUM_F32, 65, 1, tid=9, corr=1))  # another stream: _linear_kernel is not before it
    g = kernels.group_trace({"traceEvents": ev})
    assert g["count"]["gguf_moe"] == 4 and g["count"]["gguf_dense"] == 5, g["count"]
    assert g["count"]["other"] == 4 and g["count"]["norm_rope_act"] == 1


def test_register_mma_kernels_are_placed_by_the_silu_between_the_moe_passes():
    """Under a CUDA graph the shim's _mma_kernel is a MoE pass right before (w13) or after (w2) the MoE's
    _silu_mul_splits_kernel, with the top-k sum after w2; elsewhere it is a dense linear, with its split-K sum and
    the copy back."""
    names = ["void vllm::moe::moe_align_block_size_kernel<int>(...)", "_mma_kernel", "_silu_mul_splits_kernel",
             "_mma_kernel", SUM_BF16,
             "triton_red_fused_fused_add_rms_norm_moe_forward_shared_0", "_mma_kernel", SUM_F32, COPY]
    ev = [_ev("cuda_runtime", "cudaGraphLaunch", 0, 2, corr=1)]
    ev += [_ev("kernel", n, 10 + 10 * i, 1, tid=7, corr=1) for i, n in enumerate(names)]
    g = kernels.group_trace({"traceEvents": ev})
    assert g["count"]["gguf_moe"] == 6 and g["count"]["gguf_dense"] == 3, g["count"]


def test_named_register_mma_moe_passes_and_their_sums_are_moe():
    """Since 2026-12-03 the register-MMA kernel's MoE passes launch as _mma_moe_kernel (two launches, no SiLU kernel
    between them; the top-k sum after w2 where the routing is sorted); _mma_kernel stays a dense linear, whose split
    sum is now inside the kernel."""
    names = ["void vllm::moe::grouped_topk_fused_small_expert_count_kernel<...>", "_mma_moe_kernel",
             "_mma_moe_kernel", "triton_red_fused_fused_add_rms_norm_moe_forward_shared_0", "_mma_kernel",
             "void vllm::moe::moe_align_block_size_kernel<int>(...)", "_mma_moe_kernel", "_mma_moe_kernel", SUM_BF16]
    ev = [_ev("cuda_runtime", "cudaGraphLaunch", 0, 2, corr=1)]
    ev += [_ev("kernel", n, 10 + 10 * i, 1, tid=7, corr=1) for i, n in enumerate(names)]
    g = kernels.group_trace({"traceEvents": ev})
    assert g["count"]["gguf_moe"] == 8 and g["count"]["gguf_dense"] == 1, g["count"]   # the fused norm is MoE too


def test_decode_window_counts_only_tokens_while_every_stream_decodes():
    # stream A: first token at 1.0, then every 0.1 s to 3.0; stream B starts at 1.5 and ends at 2.5
    a = [1.0 + 0.1 * i for i in range(21)]
    b = [1.5 + 0.1 * i for i in range(11)]
    w = measure.decode_window([a, b])
    assert w["window_s"] == pytest.approx(1.0)
    # inside (1.5, 2.5]: A has 10 stamps (1.6..2.5), B has 10 (1.6..2.5)
    assert w["window_tokens"] == 20 and w["decode_tok_s"] == pytest.approx(20.0)
    assert w["per_stream_tok_s"] == pytest.approx(10.0)
    assert measure.decode_window([[1.0]])["decode_tok_s"] is None  # one token: no decode at all
    # the same chunks carrying 2 tokens each (speculative decoding: a step emits 1 + accepted tokens)
    w2 = measure.decode_window([a, b], [42, 22])
    assert w2["window_tokens"] == 40 and w2["decode_tok_s"] == pytest.approx(40.0)
    assert w2["per_stream_tok_s"] == pytest.approx((41 / 2.0 + 21 / 1.0) / 2) and w2["tokens_per_chunk"] == 2.0
    assert measure.decode_window([a, b], [21, 11]) == dict(w, tokens_per_chunk=1.0)


def test_logprobs_are_compared_token_by_token():
    shim = [{"prompt_tokens": 64, "id": 5, "top": {"5": -0.50, "7": -1.20, "9": -3.0}},
            {"prompt_tokens": 600, "id": 3, "top": {"3": -0.69, "4": -0.70}}]
    native = [{"prompt_tokens": 64, "id": 5, "top": {"5": -0.52, "7": -1.15, "8": -4.0}},
              {"prompt_tokens": 600, "id": 4, "top": {"4": -0.68, "3": -0.71}}]
    c = measure.compare_logprobs(shim, native)
    assert c["same_top1"] == 1 and c["of"] == 2
    r0, r1 = c["rows"]
    assert r0["top1_dlogprob"] == pytest.approx(0.02) and r0["max_dlogprob_common"] == pytest.approx(0.05)
    assert r0["common_of_5"] == 2 and r0["top2_gap"] == pytest.approx(0.7)
    assert not r1["same_top1"] and r1["top2_gap"] == pytest.approx(0.01)  # a near tie explains the flip
    assert c["max_top1_dlogprob"] == pytest.approx(0.02)


def test_weight_groups_add_up_and_follow_the_rank():
    r8 = plan_groups(4, 1, "Q4_K_M", 8)
    full = plan_groups(4, 1, "Q4_K_M", 1)
    per_layer = (r8["moe_layers"] * (r8["routed_per_moe_layer"] + r8["shared_expert_per_moe_layer"]
                                     + r8["router_per_moe_layer"])
                 + r8["dense_layers"] * r8["dense_ffn_per_dense_layer"]
                 + r8["layers"] * (r8["attn_gguf_per_layer"] + r8["attn_other_per_layer"]))
    assert abs(r8["total"] - per_layer - r8["lm_head"] - r8["embedding"] - r8["norms"]) < 16  # per-layer rounding
    assert r8["norms"] == 4 * (2 * 6144 + 2048 + 512 + 2 * 128) * 4 + 6144 * 4  # F32 norm weights (and k_norm bias)
    assert full["routed_per_moe_layer"] == 8 * r8["routed_per_moe_layer"]
    assert full["lm_head"] == 8 * r8["lm_head"]
    g = weight_groups([("blk.0.attn_q_a.weight", "Q4_K", 10), ("blk.0.attn_k_b.weight", "Q5_0", 3),
                       ("blk.0.indexer.proj.weight", "Q4_K", 2), ("blk.0.attn_norm.weight", "F32", 1),
                       ("blk.1.ffn_up_exps.weight", "Q4_K", 100), ("blk.1.ffn_gate_inp.weight", "F32", 7),
                       ("output.weight", "Q6_K", 50)], layers=2, dense_layers=1)
    assert g["attn_gguf_per_layer"] == 5 and g["attn_other_per_layer"] == 2  # k_b and indexer.proj: not GGUF matmuls
    assert g["routed_per_moe_layer"] == 100 and g["router_per_moe_layer"] == 7 and g["lm_head"] == 50


def test_per_layer_costs_add_back_to_the_measured_step():
    res = json.loads(FIXTURE.read_text())
    groups = res["slices"]["r8-Q4_K_M"]["bytes_by_group"]
    per_step = res["parts"]["a"]["profile"]["decode_c1"]["per_step_us"]
    c = projection.per_layer_costs(per_step, groups)
    nm, nd = groups["moe_layers"], groups["dense_layers"]
    total = (nm * sum(c["moe_layer"].values()) + nd * sum(c["dense_layer"].values()) + sum(c["once"].values()))
    assert total == pytest.approx(sum(per_step.values()))
    assert c["moe_layer"]["gguf_moe"] == pytest.approx(per_step["gguf_moe"] / nm)
    assert c["once"]["sampling"] == per_step["sampling"]


def _rows(p):
    return {(r["gpu"], r["window"]): r for r in p["rows"]}


def test_projection_arithmetic():
    res = json.loads(FIXTURE.read_text())
    a = projection.Assumptions()
    base = _rows(projection.project(res, "a", a))
    rtx = base[("8x RTX PRO 6000 Blackwell", "decode_c1")]
    h200 = base[("8x H200", "decode_c1")]
    # the H200 row at the measured bandwidth is the slice's per-layer time × the full model's layer counts
    per_step = res["parts"]["a"]["profile"]["decode_c1"]["per_step_us"]
    nm = 75
    assert h200["scaled_us_by_group"]["gguf_moe"] == pytest.approx(nm * per_step["gguf_moe"] / 3, rel=1e-3)
    assert h200["scaled_us_by_group"]["sampling"] == pytest.approx(per_step["sampling"], rel=1e-3)
    # bandwidth ratio: every decode group of the RTX row is the H200 one × 4270 / 1800
    for k, v in h200["scaled_us_by_group"].items():
        assert rtx["scaled_us_by_group"][k] == pytest.approx(v * 4270 / 1800, rel=1e-3)
    # doubling the target's bandwidth halves the bandwidth-bound part and leaves the rest
    fast = copy.deepcopy(a)
    fast.targets[0].bandwidth_gbs *= 2
    rtx2 = _rows(projection.project(res, "a", fast))[("8x RTX PRO 6000 Blackwell", "decode_c1")]
    assert rtx2["kernels_us"] == pytest.approx(rtx["kernels_us"] / 2, rel=1e-3)
    assert rtx2["comm_us"] == rtx["comm_us"] and rtx2["host_us"] == rtx["host_us"]
    # communication: 2 all-reduces a layer + 1 (embedding) of 6144 × T bf16, and one logits gather
    g = a.targets[0]
    ar = g.allreduce_latency_us + 2 * 7 / 8 * 6144 * 2 / (g.link_busbw_gbs * 1e3)
    gather = g.allreduce_latency_us + 7 / 8 * 154880 * 2 / (g.link_busbw_gbs * 1e3)
    assert rtx["comm_us"] == pytest.approx(157 * ar + gather, abs=0.2)
    # host share: the measured TPOT minus the kernels a step (1.0 ms − 0.66 ms in the fixture), on every machine
    assert rtx["host_us"] == pytest.approx(340.0) and h200["host_us"] == pytest.approx(340.0)
    assert rtx["step_us"] == pytest.approx(rtx["kernels_us"] + rtx["comm_us"] + rtx["host_us"], abs=0.2)
    assert rtx["per_stream_tok_s"] == pytest.approx(1e6 / rtx["step_us"], rel=1e-3)
    c32 = base[("8x H200", "decode_c32")]
    assert c32["tokens"] == 32 and c32["aggregate_tok_s"] == pytest.approx(32 * c32["per_stream_tok_s"], rel=1e-3)
    # a compute-bound group scales by tensor throughput instead
    cb = copy.deepcopy(a)
    cb.decode_compute_bound = ("gguf_moe",)
    rtx3 = _rows(projection.project(res, "a", cb))[("8x RTX PRO 6000 Blackwell", "decode_c1")]
    assert rtx3["scaled_us_by_group"]["gguf_moe"] == pytest.approx(
        h200["scaled_us_by_group"]["gguf_moe"] * 989 / 500, rel=1e-3)


def test_prefill_projection_leaves_lm_head_to_the_last_token():
    """A prefill chunk of one request: lm_head and the logits gather are for one row, not the chunk's 8192."""
    res = json.loads(FIXTURE.read_text())
    groups = res["slices"]["r8-Q4_K_M"]["bytes_by_group"]
    per_step = {"gguf_moe": 9000.0, "gguf_dense": 4000.0, "attention": 800.0, "indexer": 600.0,
                "norm_rope_act": 300.0, "sampling": 10.0, "other": 500.0}
    res["parts"]["a"]["profile"]["prefill"] = {"per_step_us": per_step, "in_len": 8192}
    c = projection.per_layer_costs(per_step, groups, prefill=True)
    assert c["once"]["gguf_dense"] == 0
    nm, nd = groups["moe_layers"], groups["dense_layers"]
    assert nm * sum(c["moe_layer"].values()) + nd * sum(c["dense_layer"].values()) + sum(c["once"].values()) \
        == pytest.approx(sum(per_step.values()))
    rows = _rows(projection.project(res, "a", prefill=True))
    g = projection.Assumptions().targets[0]
    rtx = rows[("8x RTX PRO 6000 Blackwell", "prefill")]
    ar = g.allreduce_latency_us + 2 * 7 / 8 * 6144 * 8192 * 2 / (g.link_busbw_gbs * 1e3)
    gather = g.allreduce_latency_us + 7 / 8 * 154880 * 2 / (g.link_busbw_gbs * 1e3)
    assert rtx["tokens"] == 8192 and rtx["comm_us"] == pytest.approx(157 * ar + gather, rel=1e-4)
    # the layers' dense bytes carry all of the measured GGUF dense time: 78 layers' worth of it, scaled
    layer_bytes = lambda n, nd_, nm_: (n * groups["attn_gguf_per_layer"] + nd_ * groups["dense_ffn_per_dense_layer"]
                                       + nm_ * groups["shared_expert_per_moe_layer"])
    h200 = rows[("8x H200", "prefill")]
    assert h200["h200_us_by_group"]["gguf_dense"] == pytest.approx(
        per_step["gguf_dense"] * layer_bytes(78, 3, 75) / layer_bytes(4, 1, 3), rel=1e-3)


def test_projection_uses_the_full_models_bytes_a_layer():
    res = json.loads(FIXTURE.read_text())
    full = plan_groups(78, 3, "Q4_K_M", 8)
    same = _rows(projection.project(res, "a"))[("8x H200", "decode_c1")]
    mixed = _rows(projection.project(res, "a", full_groups=full))[("8x H200", "decode_c1")]
    scale = full["routed_per_moe_layer"] / res["slices"]["r8-Q4_K_M"]["bytes_by_group"]["routed_per_moe_layer"]
    assert mixed["scaled_us_by_group"]["gguf_moe"] == pytest.approx(same["scaled_us_by_group"]["gguf_moe"] * scale,
                                                                    rel=1e-3)


def test_latency_held_projection_scales_only_each_groups_floor():
    """The optimistic table: time above a group's bandwidth floor stays as on the H200, the floor scales."""
    res = json.loads(FIXTURE.read_text())
    a = projection.Assumptions()
    rows = _rows(projection.project(res, "a", a))
    g = res["slices"]["r8-Q4_K_M"]["bytes_by_group"]
    scale = projection.byte_scale(g, None)
    for window, streams in (("decode_c1", 1), ("decode_c32", 32)):
        rtx, h200 = rows[("8x RTX PRO 6000 Blackwell", window)], rows[("8x H200", window)]
        assert h200["held_us_by_group"] == h200["scaled_us_by_group"]  # same bandwidth: nothing to hold
        floors = projection.floor_bytes(a, g, scale, streams, 2048, g["lm_head"])
        for k, v in h200["h200_us_by_group"].items():
            f_h200, f_rtx = floors.get(k, 0) / 4270e3, floors.get(k, 0) / 1800e3
            assert rtx["held_us_by_group"][k] == pytest.approx(max(v - f_h200, 0) + f_rtx, abs=0.1)
            assert rtx["held_us_by_group"][k] <= rtx["scaled_us_by_group"][k] + 0.1
        assert rtx["held_us_by_group"]["norm_rope_act"] == h200["scaled_us_by_group"]["norm_rope_act"]
        assert rtx["held_per_stream_tok_s"] > rtx["per_stream_tok_s"]
    # uniform routing: one token touches top_k experts, many tokens nearly all of them
    one, many = (projection.floor_bytes(a, g, scale, t, 2048, 0)["gguf_moe"] for t in (1, 4096))
    assert one == pytest.approx(75 * g["routed_per_moe_layer"] * 8 / 256)
    assert many == pytest.approx(75 * g["routed_per_moe_layer"], rel=1e-6)
    # a prefill chunk gets no latency-held variant
    res["parts"]["a"]["profile"]["prefill"] = {"per_step_us": {"gguf_moe": 1.0}, "in_len": 8192}
    assert all("held_step_us" not in r for r in projection.project(res, "a", a, prefill=True)["rows"])


def test_projection_stops_when_the_full_model_cannot_be_planned():
    """No silent fallback to the slice's bytes a layer (the 2026-12-03 projection had one): one line, and the flag
    that makes that assumption explicit."""
    res = json.loads(FIXTURE.read_text())
    assert projection.full_model_groups(res, "a", projection.Assumptions())["routed_per_moe_layer"] > 0
    res["slices"]["r8-Q4_K_M"]["preset"] = "Q9_K_XL"
    with pytest.raises(SystemExit, match="preset 'Q9_K_XL'.*--no-full-bytes"):
        projection.full_model_groups(res, "a", projection.Assumptions())


def test_projection_command_prints_every_assumption(capsys):
    assert projection.main([str(FIXTURE), "--no-full-bytes"]) == 0
    out = capsys.readouterr().out
    for needle in ("78 layers", "4270 GB/s (measured copy)", "1800 GB/s", "PCIe", "51.6 tokens/s single stream",
                   "host's share", "| 8x RTX PRO 6000 Blackwell | decode_c1 | 1 |", "| 8x H200 | decode_c32 | 32 |"):
        assert needle in out, needle
    res = json.loads(FIXTURE.read_text())
    res["slices"]["r8-Q4_K_M"]["rank_of"] = 1
    with pytest.raises(SystemExit, match="rank-of-8"):
        projection.project(res, "a")
    with pytest.raises(SystemExit, match="no part 'b'"):
        projection.project(res, "b")


def test_projection_with_the_measured_mtp_factor(tmp_path, capsys):
    """--mtp-json: rows whose tokens/s are the plain projection's times K drafts' measured factor over K=0 at the
    same number of streams (the factor read from the MTP run, not assumed)."""
    def arm(k, tps):
        return {"model": "slice-peaked-mtp", "path": "shim", "k": k,
                "throughput": {str(c): {"output_tok_s": v, "metrics": {"acceptance": 0.8 if k else None}}
                               for c, v in tps.items()}}
    mtp = {"slice": {"preset": "UD-IQ2_M-like", "layers": 40, "rank_of": 8},
           "arms": {"k0": arm(0, {1: 100.0, 4: 300.0, 32: 1000.0}), "k3": arm(3, {1: 150.0, 32: 1800.0})}}
    f = projection.mtp_factors(mtp, 3)
    assert f["by_streams"] == {1: {"factor": 1.5, "acceptance": 0.8}, 32: {"factor": 1.8, "acceptance": 0.8}}
    plain = projection.project(json.loads(FIXTURE.read_text()), "a")
    proj = projection.with_mtp(copy.deepcopy(plain), f)
    for r, r0 in zip(proj["rows"], plain["rows"]):
        want = 1.5 if r["streams"] == 1 else 1.8
        assert r["mtp_per_stream_tok_s"] == round(r0["per_stream_tok_s"] * want, 1), r
    (tmp_path / "mtp.json").write_text(json.dumps(mtp))
    assert projection.main([str(FIXTURE), "--no-full-bytes", "--mtp-json", str(tmp_path / "mtp.json"),
                            "--mtp-k", "3"]) == 0
    out = capsys.readouterr().out
    assert "With MTP, K=3" in out and "x1.50 (0.80)" in out and "MTP K=3: tokens/s times the factor" in out
    with pytest.raises(SystemExit, match="no K=1 arm"):
        projection.mtp_factors(mtp, 1)


def test_report_renders_the_fixture():
    md = report(json.loads(FIXTURE.read_text()))
    assert "## Kernel time per engine step" in md and "| a | decode_c32 | 100 |" in md
    assert "| a | 2048 | 32 | 16000.0 |" in md


def test_a_part_against_the_stand_in_server(tmp_path, monkeypatch):
    """Part a end to end on the CPU: launch.sh replaced by the stand-in server (which prints vLLM's start-up lines
    and writes a small trace on /stop_profile); the slice file is not written (make_slice_file stubbed)."""
    import e2e_parts.servers as servers

    monkeypatch.setattr(servers, "LAUNCH", REPO / "tests" / "fake_launch.sh")
    model = tmp_path / "r8.gguf"
    model.write_bytes(b"GGUF")
    groups = plan_groups(4, 1, "Q4_K_M", 8)
    monkeypatch.setattr(parts, "make_slice_file", lambda name, d: {
        "name": name, "preset": "Q4_K_M", "rank_of": 8, "path": str(model), "bytes": groups["total"],
        "bytes_by_group": groups})
    monkeypatch.setattr(parts, "OUT_LEN", 24)
    monkeypatch.setattr(parts, "PROFILE_DECODE_S", 0.2)
    monkeypatch.setattr(parts, "PROFILE_MAX_TOKENS", 64)
    monkeypatch.setattr(parts.PARTS["a"], "concurrency", (1, 8))
    out = tmp_path / "out"
    assert slice_serve.main(["run", "--out", str(out), "--parts", "a", "--base-port", str(_free_port()),
                             "--start-timeout", "60"]) == 0
    res = json.loads((out / "slice.json").read_text())
    a = res["parts"]["a"]
    assert "error" not in a, a.get("error")
    st = a["startup"]
    assert st["ok"] and st["weights_gib"] == 2.38 and st["load_s"] == 4.5
    assert st["load_gb_s"] == round(groups["total"] / 1e9 / 4.5, 2)
    assert st["env"] == {"GLM5_SHIM_ATTENTION": "triton", "GLM5_SHIM_INDEXER": "triton"}
    assert a["host_rss_peak_gib"] > 0
    assert [r["concurrency"] for r in a["decode"]] == [1, 8]
    assert all(r["errors"] == 0 and r["output_tokens"] == r["concurrency"] * 24 for r in a["decode"])
    assert a["prefill"]["errors"] == 0 and a["prefill"]["prefill_tok_s"] > 0
    assert len(a["logprobs"]) == 5 and all("top" in x for x in a["logprobs"])
    prof = a["profile"]
    assert set(prof) == {"decode_c1", "decode_c32", "prefill"}
    for window in prof.values():
        assert window["steps"] == 3 and window["per_step_us"]["gguf_moe"] == 30.0, window
        assert window["per_step_us"]["indexer"] == 8.0 and window["start_status"] == 200
    md = (out / "slice.md").read_text()
    assert "## Start-up and memory" in md and "## Decode" in md and "## Kernel time per engine step" in md


def _stand_in(tmp_path, monkeypatch) -> None:
    """launch.sh → the stand-in server; make_slice_file → a 4-byte file per slice with the planned groups (its
    file_bytes those of the slice part a measured on the H200, so that bench/results' part a can be the reference)."""
    import e2e_parts.servers as servers

    monkeypatch.setattr(servers, "LAUNCH", REPO / "tests" / "fake_launch.sh")
    ref = json.loads(slice_serve.DEFAULT_LOGPROBS_REF.read_text())["slices"]["r8-Q4_K_M"]

    def fake_slice(name, d):
        preset, rank_of = parts.SLICES[name]
        path = tmp_path / f"{name}.gguf"
        path.write_bytes(b"GGUF")
        groups = plan_groups(4, 1, preset, rank_of)
        sizes = {"bytes": ref["bytes"], "file_bytes": ref["file_bytes"]} if name == "r8-Q4_K_M" else {
            "bytes": groups["total"], "file_bytes": groups["total"] + 1}
        return {"name": name, "preset": preset, "rank_of": rank_of, "path": str(path), "bytes_by_group": groups,
                **sizes}
    monkeypatch.setattr(parts, "make_slice_file", fake_slice)
    monkeypatch.setattr(parts, "OUT_LEN", 24)
    monkeypatch.setattr(parts, "PROFILE_DECODE_S", 0.2)
    monkeypatch.setattr(parts, "PROFILE_MAX_TOKENS", 64)
    for key in "adf":
        monkeypatch.setattr(parts.PARTS[key], "concurrency", (1, 8))


def _run(out, *args) -> dict:
    assert slice_serve.main(["run", "--out", str(out), "--base-port", str(_free_port()), "--start-timeout", "60",
                             *args]) == 0
    return json.loads((out / "slice.json").read_text())


def test_parts_b_to_f_against_the_stand_in_server(tmp_path, monkeypatch):
    """Every part after a, in one run as on the device: each starts its own server with its own environment and
    slice, measures what its steps say, and part b's log-probabilities are compared with part a's of the same run."""
    _stand_in(tmp_path, monkeypatch)
    out = tmp_path / "out"
    res = _run(out, "--parts", "a,b,c,d,e,f")
    p = res["parts"]
    for key in "abcdef":
        assert "error" not in p[key] and "skipped" not in p[key], (key, p[key].get("error"), p[key].get("skipped"))
        assert p[key]["startup"]["ok"] and not p[key].get("skipped_steps"), key
        assert p[key]["prefill"]["errors"] == 0 and p[key]["prefill"]["in_len"] == parts.PARTS[key].in_len
        rows = p[key]["decode"]
        assert [r["concurrency"] for r in rows] == list(parts.PARTS[key].concurrency), key
        assert all(r["errors"] == 0 and r["in_len"] == parts.PARTS[key].in_len for r in rows), key
    env = {k: p[k]["startup"]["env"] for k in "abcdef"}
    assert env["b"] == {} and env["c"] == {"GLM5_SHIM_ATTENTION": "triton", "GLM5_SHIM_INDEXER": "triton",
                                          "GLM5_SHIM_GGUF_KERNELS": "vllm"}
    assert env["a"] == env["d"] == env["e"] == env["f"] == {"GLM5_SHIM_ATTENTION": "triton",
                                                             "GLM5_SHIM_INDEXER": "triton"}
    assert [p[k]["slice"] for k in "abcdef"] == ["r8-Q4_K_M"] * 4 + ["r8-IQ2_M", "full-Q4_K_M"]
    assert res["slices"]["full-Q4_K_M"]["rank_of"] == 1 and res["slices"]["r8-IQ2_M"]["preset"] == "UD-IQ2_M-like"
    for key in "bcef":  # the parts with a profile: both decode windows and the prefill chunk, in their own traces
        assert set(p[key]["profile"]) == {"decode_c1", "decode_c32", "prefill"}, key
        assert all(w["steps"] == 3 and w["trace"] for w in p[key]["profile"].values()), key
        assert list((out / "traces" / key).glob("*.pt.trace.json.gz")), key
    assert "profile" not in p["d"] and "logprobs" not in p["d"]
    # the same prompts, the same (stand-in) model: every top-1 agrees, nothing differs
    agree = res["logprob_agreement"]
    assert agree["reference"] == "part a of this run" and agree["prompts_checked"]
    assert agree["same_top1"] == agree["of"] == 5 and agree["errors"] == 0 and agree["max_top1_dlogprob"] == 0
    assert [x["prompt_sha"] for x in p["a"]["logprobs"]] == [x["prompt_sha"] for x in p["b"]["logprobs"]]
    md = (out / "slice.md").read_text()
    assert "Same top-1: 5 of 5" in md and "| f | 2048 | 8 |" in md and "| d | 16384 | 8 |" in md
    # the projection reads every rank-of-8 part's profile
    for key in "bce":
        assert projection.project(res, key)["rows"], key


def test_part_b_alone_is_compared_with_a_recorded_part_a(tmp_path, monkeypatch):
    """Part b in a device call of its own: part a's log-probabilities come from --logprobs-ref (default: the
    H200's part a in bench/results) when the slice is byte for byte the same; otherwise the report says why not."""
    _stand_in(tmp_path, monkeypatch)
    res = _run(tmp_path / "out", "--parts", "b")
    agree = res["logprob_agreement"]
    assert agree["reference"].startswith(f"part a of {slice_serve.DEFAULT_LOGPROBS_REF}")
    assert agree["of"] == 5 and agree["errors"] == 0  # the stand-in's numbers, against the H200's: compared
    assert "Reference (a): part a of" in (tmp_path / "out" / "slice.md").read_text()
    res = _run(tmp_path / "none", "--parts", "b", "--logprobs-ref", "")
    assert res["logprob_agreement"] == {"error": "part a did not run (no --logprobs-ref)",
                                        "reference": "part a did not run (no --logprobs-ref)"}
    assert "Not compared: part a did not run" in (tmp_path / "none" / "slice.md").read_text()
    other = json.loads(slice_serve.DEFAULT_LOGPROBS_REF.read_text())
    other["slices"]["r8-Q4_K_M"]["file_bytes"] += 1
    (tmp_path / "other.json").write_text(json.dumps(other))
    res = _run(tmp_path / "mismatch", "--parts", "b", "--logprobs-ref", str(tmp_path / "other.json"))
    assert "is not this run's" in res["logprob_agreement"]["error"]


def _tiny_gguf(path, extra_key: str | None = None, value: float = 1.0) -> Path:
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), "glm-dsa")
    if extra_key:
        w.add_string(extra_key, "x")
    w.add_tensor("blk.0.attn_norm.weight", np.full(32, value, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def test_slices_are_the_same_model_by_their_tensors_not_their_metadata(tmp_path, capsys):
    """A metadata key (the 2026-12-03 make-slice --peaked flag) changes the file's bytes, not its model: the tensor
    digest ignores it and sees one changed weight; runs that recorded digests are compared by them."""
    base = parts.tensor_digest(_tiny_gguf(tmp_path / "a.gguf"))
    assert parts.tensor_digest(_tiny_gguf(tmp_path / "b.gguf", extra_key="glm5_shim.slice.peaked")) == base
    assert parts.tensor_digest(_tiny_gguf(tmp_path / "c.gguf", value=1.5)) != base
    a = {"bytes": 128, "file_bytes": 1000, "tensor_sha256": base}
    assert parts.same_slice(dict(a, file_bytes=1032), a)[0]
    assert not parts.same_slice(dict(a, tensor_sha256="0" * 64), a)[0]
    without = {"bytes": 128, "file_bytes": 1000}
    assert parts.same_slice(without, dict(without))[0] and not parts.same_slice(dict(without, file_bytes=1032), a)[0]
    # the offline comparison of two recorded runs says whether it could check the slices
    ref = json.loads(slice_serve.DEFAULT_LOGPROBS_REF.read_text())
    b = {"slices": ref["slices"], "parts": {"b": {"logprobs": ref["parts"]["a"]["logprobs"]}}}
    (tmp_path / "b.json").write_text(json.dumps(b))
    assert slice_serve.main(["logprobs", str(slice_serve.DEFAULT_LOGPROBS_REF), str(tmp_path / "b.json")]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("slices: file bytes") and " equal" in printed.splitlines()[0]
    assert json.loads(printed.split("\n", 1)[1])["same_top1"] == 5


def test_logprobs_of_different_prompts_are_not_compared():
    a = [{"prompt_tokens": 64, "prompt_sha": "x", "id": 5, "top": {"5": -0.5}}]
    b = [{"prompt_tokens": 64, "prompt_sha": "y", "id": 5, "top": {"5": -0.5}}]
    c = measure.compare_logprobs(a, b)
    assert c["of"] == 0 and c["errors"] == 1 and "different prompts" in c["rows"][0]["error"]
    b[0]["prompt_tokens"] = 65
    b[0].pop("prompt_sha")
    assert measure.compare_logprobs(a, b)["errors"] == 1
    assert "| error: different prompts" in report({"logprob_agreement": c})


def test_a_part_past_the_budget_stops_cleanly(tmp_path, monkeypatch):
    """A part started just inside --budget-s: its server starts, its steps are skipped, its server stops, and
    slice.json and slice.md are written; the next part is not started."""
    _stand_in(tmp_path, monkeypatch)
    monkeypatch.setattr(parts.PARTS["a"], "est_s", 1)
    res = _run(tmp_path / "out", "--parts", "a,b", "--budget-s", "20")
    a = res["parts"]["a"]
    assert a["startup"]["ok"] and "error" not in a
    assert a["skipped_steps"] == ["decode", "prefill", "logprobs", "profile"]
    assert "time budget" in res["parts"]["b"]["skipped"]
    assert "skipped for time: decode, prefill, logprobs, profile" in (tmp_path / "out" / "slice.md").read_text()


def test_the_budget_skips_parts_that_would_not_finish(tmp_path):
    out = tmp_path / "out"
    assert slice_serve.main(["run", "--out", str(out), "--parts", "a,b", "--budget-s", "10"]) == 0
    res = json.loads((out / "slice.json").read_text())
    assert all("time budget" in res["parts"][k]["skipped"] for k in ("a", "b"))
    assert "time budget" in (out / "slice.md").read_text()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unknown_parts_are_refused():
    with pytest.raises(SystemExit):
        slice_serve.main(["run", "--out", "/tmp/x", "--parts", "a,z"])


def test_parts_serve_alone_on_the_gpu_with_the_profiler_armed(tmp_path):
    limits, extra = parts.serve_flags(tmp_path)
    assert limits == ("--max-model-len", "18432", "--gpu-memory-utilization", "0.9")
    assert "--enforce-eager" not in extra and "--no-enable-prefix-caching" in extra
    cfg = json.loads(extra[extra.index("--profiler-config") + 1])
    assert cfg["profiler"] == "torch" and Path(cfg["torch_profiler_dir"]).is_absolute()
    assert cfg["ignore_frontend"] and not cfg["torch_profiler_with_stack"]
    assert [p.key for p in parts.PARTS.values()] == [*"abcdefghi", "F", "F32k", "FI", "FM1", "FM3"]
    assert (parts.PARTS["FM1"].spec_k, parts.PARTS["FM3"].spec_k) == (1, 3)
    assert len({parts.PARTS[k].server_key for k in ("F", "FM1", "FM3")}) == 3
    # the full-depth 2k and 32k parts share one server whose model length takes a 32k prompt
    assert parts.PARTS["F"].server_key == parts.PARTS["F32k"].server_key != parts.PARTS["a"].server_key
    assert parts.serve_flags(tmp_path, parts.PARTS["F"].model_len)[0][1] == "34816"
    assert parts.PARTS["i"].env == {"GLM5_SHIM_GGUF_SPLITS": "launch"} and parts.PARTS["a"].env == {}
    assert parts.PARTS["g"].env == {"GLM5_SHIM_GGUF_DECODE": "tile"}
    assert parts.PARTS["i"].server_key != parts.PARTS["h"].server_key
    assert parts.PARTS["c"].kernels == "vllm" and parts.PARTS["b"].path == "native"
    g, h = parts.PARTS["g"], parts.PARTS["h"]
    assert g.decode == "tile" and h.decode == "mma" and g.server_key != h.server_key
    arm = parts.SliceArm("c", "r8-Q4_K_M", "auto", "shim", kernels="vllm")
    env = arm.env()
    assert env["GLM5_SHIM_GGUF_KERNELS"] == "vllm" and env["GLM5_SHIM_ATTENTION"] == "triton"
    assert "GLM5_SHIM_ATTENTION" not in parts.SliceArm("b", "r8-Q4_K_M", "auto", "native").env()
    tile = parts.SliceArm("g", "r8-Q4_K_M", "auto", "shim", extra_env={"GLM5_SHIM_GGUF_DECODE": "tile"}).env()
    assert tile["GLM5_SHIM_GGUF_DECODE"] == "tile" and tile["GLM5_SHIM_ATTENTION"] == "triton"


def test_full_depth_slices_are_the_shared_data_78_layer_ranks(tmp_path):
    """The full-depth parts' slices: 78 layers (3 dense) + the MTP block, peaked, --shared-data; make_slice_file
    reports the loaded bytes (the whole rank) apart from the file's, and reuses a complete file."""
    for name in parts.FULL_DEPTH_SLICES:
        plan = parts.slice_plan(name)
        assert (plan.config["num_hidden_layers"], plan.config["first_k_dense_replace"]) == (78, 3)
        assert plan.peaked and plan.shared_data and plan.config["num_nextn_predict_layers"] == 1
        assert plan.file_data_nbytes < 3e9 < 25e9 < plan.nbytes
    assert parts.slice_plan("r8-Q4_K_M").nbytes == parts.plan_groups(4, 1, "Q4_K_M", 8)["total"]
    groups = parts.plan_groups(78, 3, "Q4_K_M", 8)
    assert groups["moe_layers"] == 75 and groups["total"] < parts.slice_plan("r8-Q4_K_M-78L").nbytes  # no MTP block


def test_full_depth_parts_against_the_stand_in_server(tmp_path, monkeypatch):
    """Parts F and F32k on one server (the same key: started once), F's profiles at 1 and 8 streams, F32k's 32k
    prompts inside the server's 34816-token length; the start-up record relates GPU weights to the rank's bytes."""
    import e2e_parts.servers as servers

    monkeypatch.setattr(servers, "LAUNCH", REPO / "tests" / "fake_launch.sh")
    started = []
    real_start = servers.start

    def counting_start(arm, *a, **k):
        started.append((arm.name, k.get("limits")))
        return real_start(arm, *a, **k)
    monkeypatch.setattr(parts, "start", counting_start)

    def fake_slice(name, d):
        path = tmp_path / f"{name}.gguf"
        path.write_bytes(b"GGUF")
        plan = parts.slice_plan(name)
        return {"name": name, **parts.slice_shape(name), "path": str(path), "bytes": plan.nbytes,
                "file_bytes": plan.file_data_nbytes, "bytes_by_group": parts.plan_groups(78, 3, "Q4_K_M", 8)}
    monkeypatch.setattr(parts, "make_slice_file", fake_slice)
    monkeypatch.setattr(parts, "OUT_LEN", 16)
    monkeypatch.setattr(parts, "PROFILE_MAX_TOKENS", 64)
    monkeypatch.setattr(parts.PARTS["F"], "concurrency", (1, 2))
    monkeypatch.setattr(parts.PARTS["F32k"], "concurrency", (1,))
    res = _run(tmp_path / "out", "--parts", "F,F32k")
    f, f32 = res["parts"]["F"], res["parts"]["F32k"]
    assert "error" not in f and "error" not in f32, (f.get("error"), f32.get("error"))
    assert len(started) == 1 and started[0][1][1] == "34816" and f32["server"].startswith("reused")
    assert set(f["profile"]) == {"decode_c1", "decode_c8", "prefill"}
    assert all(w["seconds"] == 0.4 for k, w in f["profile"].items() if k.startswith("decode"))
    assert [r["in_len"] for r in f32["decode"]] == [32768] and f32["decode"][0]["errors"] == 0
    assert f32["prefill"]["requests"] == 2 and f32["prefill"]["errors"] == 0
    md = (tmp_path / "out" / "slice.md").read_text()
    assert "## Per decoder layer, decode" in md and "| F | decode_c1 | 78 |" in md and "| F | decode_c8 | 78 |" in md
    st = f["startup"]
    rank_bytes = parts.slice_plan("r8-Q4_K_M-78L").nbytes
    assert st["weights_over_tensor_bytes"] == round(st["weights_gib"] * 2**30 / rank_bytes, 3)


def test_mtp_parts_serve_with_a_draft_and_count_acceptance(tmp_path, monkeypatch):
    """FM1 and FM3: each its own server with --speculative-config (method mtp, K), one at a time; every decode wave
    records vLLM's spec-decode counters over it (the stand-in accepts 3 of 4 drafted tokens)."""
    import e2e_parts.servers as servers

    monkeypatch.setattr(servers, "LAUNCH", REPO / "tests" / "fake_launch.sh")
    flags = []
    real_start = servers.start
    monkeypatch.setattr(parts, "start", lambda arm, *a, **k: (flags.append(k.get("extra")), real_start(arm, *a, **k)))

    def fake_slice(name, d):
        path = tmp_path / f"{name}.gguf"
        path.write_bytes(b"GGUF")
        return {"name": name, **parts.slice_shape(name), "path": str(path), "bytes": 1,
                "bytes_by_group": parts.plan_groups(4, 1, "Q4_K_M", 8)}
    monkeypatch.setattr(parts, "make_slice_file", fake_slice)
    monkeypatch.setattr(parts, "OUT_LEN", 16)
    res = _run(tmp_path / "out", "--parts", "FM1,FM3")
    assert len(flags) == 2
    for k, extra in zip((1, 3), flags):
        assert json.loads(extra[extra.index("--speculative-config") + 1]) == {"method": "mtp",
                                                                               "num_speculative_tokens": k}
        rows = res["parts"][f"FM{k}"]["decode"]
        assert [r["concurrency"] for r in rows] == [1, 8]
        for r in rows:
            assert r["spec"]["k"] == k and r["spec"]["draft_tokens"] == k * r["spec"]["drafts"] > 0
            assert r["spec"]["acceptance"] == pytest.approx(0.75, abs=0.01)
