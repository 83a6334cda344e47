"""Kernel name → category, and a torch-profiler trace (chrome-trace JSON, as vLLM 0.23's worker profiler writes it)
grouped per category and per engine step.

Categories (the issue's groups; `OTHER_KINDS` split "other" for the report):
  gguf_moe      routed experts: the shim's `_moe_kernel`; vLLM's `moe_q*`/`moe_vec_q*` (ggml_moe_a8[_vec]),
                `moe_sum`, routing (top-k, align/sort by expert, router gemm)
  gguf_dense    GGUF linears: the shim's `_linear_kernel`, `_dequant_kernel`; vLLM's `mul_mat_vec_q*`, `mul_mat_q*`,
                `dequantize_block*`, `quantize_q8_1` (its activation quantizer: the MoE's when the next kernel on
                its stream is a MoE kernel)
  attention     sparse MLA: the shim's `_sparse_mla_fwd_kernel`, `_sparse_mla_combine_kernel`, `_convert_kernel`
                (top-k positions → cache slots); FlashMLA's kernels; KV-cache insert (concat_and_cache_*),
                concat_mla_q, fp8 gather/upconvert
  indexer       DSA indexer: the shim's `_mqa_logits_kernel`, `_paged_mqa_logits_kernel`, `_fill_outside_kernel`;
                DeepGEMM's fp8_(paged_)mqa_logits; vLLM's indexer cache ops and top-k (top_k_per_row_*, persistent_topk)
  norm_rope_act RMS norms, rotary embedding, SiLU·mul, and Inductor's fused elementwise Triton kernels (triton_poi_*,
                triton_red_*, triton_per_*: residual adds, norms and casts that torch.compile fused)
  sampling      sampler and logprobs: argmax, (log-)softmax over the vocabulary, top-k/top-p, gumbel/exponential
  other         the rest: cuBLAS/CUTLASS gemms not launched from a GGUF op (W_UK/W_UV bmm, the indexer's
                dequantized wk/weights_proj, the float router gate), copies, memsets, all-reduce
A gemm or copy launched (per the trace's CPU side) inside a GGUF op (`glm5_gguf_linear`, `ggml_*`), the fused MoE, the
indexer op or the attention op takes that op's category: the shim's dense prefill path dequantizes and then runs a
cuBLAS gemm. Under CUDA graphs the CPU side is one graph launch, so such kernels stay in "other" — except, by
their place on the stream, the torch sum (and the copy after it) that ends the shim's split-K `_linear_kernel`
(`out.copy_(dst.sum(0))`) and the top-k sum after the shim's `_moe_kernel`: they take that kernel's category.
"""
from __future__ import annotations

import bisect
import gzip
import json
import re
from collections import defaultdict
from pathlib import Path

CATEGORIES = ("gguf_moe", "gguf_dense", "attention", "indexer", "norm_rope_act", "sampling", "other")
LABELS = {"gguf_moe": "GGUF MoE", "gguf_dense": "GGUF dense", "attention": "attention", "indexer": "indexer",
          "norm_rope_act": "norms/rope/activation", "sampling": "sampling", "other": "other"}

# (category, pattern) in order: the first that matches (case-insensitive search) wins
_RULES: tuple[tuple[str, str], ...] = (
    # the DSA indexer first: its top-k and cache ops would otherwise look like MoE routing or attention
    # (per_token_group_quant: the indexer's q to fp8, deepseek_v2.Indexer; nothing else is fp8 in a GGUF model)
    ("indexer", r"mqa_logits|_fill_outside_kernel|indexer|top_?k_per_row|persistent_topk|clean_logits|"
                r"per_token_group_quant"),
    # (Triton kernels are named after their function; an older Triton appended a signature suffix;
    # _convert_req_index_to_global_index_kernel is the native arm's top-k → cache slot step, the shim's _convert_kernel)
    ("attention", r"mla|flash_fwd|concat_and_cache|cp_gather_and_upconvert|^_convert_(req_index_to_global_index_)?"
                  r"kernel|sparse_attn"),
    ("gguf_moe", r"^_moe_kernel|^_mma_moe_kernel|^_silu_mul_splits_kernel|moe_q\d|moe_vec_q|moe_sum|moe_align|"
                 r"sort_expert|count_and_sort|grouped_?topk|topk_?gating|topk_?softmax|topk_?sigmoid|topk_with_k2|"
                 r"group_idx_and_topk|noaux|router_gemm|fused_moe|moe_|moe::|moeTopK|moeSoftmax|moeSigmoid"),
    ("gguf_dense", r"^_linear_kernel|^_mma_kernel|^_dequant_kernel|mul_mat_vec_q|mul_mat_q|dequantize_block|"
                   r"quantize_q8_1|ggml"),
    ("norm_rope_act", r"rms_?norm|layer_?norm|rotary|\brope\b|rope_|silu|act_and_mul|gelu|swiglu|"
                      r"^triton_(poi|red|per)_"),
    ("sampling", r"argmax|log_?softmax|softmax|sampl|gumbel|exponential|top_?k_?top_?p|penalt|logits_?process"),
)
_COMPILED = tuple((cat, re.compile(pat, re.IGNORECASE)) for cat, pat in _RULES)
# kernels of "other", by kind, for the report's breakdown
OTHER_KINDS = (("gemm (cuBLAS/CUTLASS)", re.compile(r"gemm|nvjet|cutlass|xmma|wgmma|cublas|sm\d\d_|ampere_|"
                                                      r"splitkreduce", re.IGNORECASE)),
               ("all-reduce", re.compile(r"allreduce|all_reduce|nccl|cross_device_reduce", re.IGNORECASE)),
               ("copy/fill", re.compile(r"copy|memcpy|memset|fill|cat_|index|gather|scatter", re.IGNORECASE)))
# kernels placed by their neighbours on the stream (module docstring)
_QUANTIZE_Q8_1 = re.compile(r"quantize_q8_1")
_SPLIT_K_PRODUCER = re.compile(r"^_linear_kernel|^_moe_kernel|^_mma_(moe_)?kernel")
# before 2026-12-03 the register-MMA kernel served dense linears and both MoE passes under one name: a MoE pass was
# next to the SiLU of its split sums (since, MoE passes launch as _mma_moe_kernel)
_MMA = re.compile(r"^_mma_kernel")
_SILU_SPLITS = re.compile(r"^_silu_mul_splits_kernel")
_SUM = re.compile(r"reduce_kernel.*sum_fun", re.IGNORECASE)
_COPY = re.compile(r"copy_kernel", re.IGNORECASE)
# CPU ops whose launches take the op's category (innermost enclosing op wins)
_OP_RULES = tuple((cat, re.compile(pat, re.IGNORECASE)) for cat, pat in (
    ("gguf_moe", r"glm5_gguf_moe|ggml_moe|fused_moe|moe_forward"),
    ("gguf_dense", r"glm5_gguf_linear|ggml_mul_mat|ggml_dequantize|fused_mul_mat_gguf"),
    ("indexer", r"sparse_attn_indexer"),
    ("attention", r"mla_attention|unified_attention|unified_mla"),
))


def classify(name: str) -> str:
    """The category of one kernel name (CATEGORIES)."""
    for cat, pattern in _COMPILED:
        if pattern.search(name):
            return cat
    return "other"


def other_kind(name: str) -> str:
    for kind, pattern in OTHER_KINDS:
        if pattern.search(name):
            return kind
    return "misc"


def load_trace(path: str | Path) -> dict:
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def _op_category_at(ops_by_tid: dict, tid, ts: float) -> str | None:
    """The category of the innermost recognised CPU op on thread `tid` that encloses time `ts`."""
    starts, spans = ops_by_tid.get(tid, ((), ()))
    i = bisect.bisect_right(starts, ts)
    best = None
    for j in range(i - 1, -1, -1):  # ops sorted by start; the innermost enclosing one has the latest start
        start, end, cat = spans[j]
        if start <= ts <= end:
            best = cat
            break
        if ts - start > 60e6:  # a minute back: nothing encloses it
            break
    return best


def group_trace(trace: dict, step_pattern: str = r"^execute_context_") -> dict:
    """Kernel time per category over a trace, and per engine step.

    Steps are vLLM's per-step annotations (`execute_context_<n>(<tokens>)_generation_<m>(<tokens>)`, CPU user
    annotations); the per-step figures divide by how many there were. Returns {"steps", "step_names" (count per
    annotation), "kernel_us" (category → µs in all), "per_step_us", "count", "top" (category → [[name, µs, n]...]),
    "other_kinds" (kind → µs), "gpu_span_us" (first kernel start to last kernel end), "kernels"}."""
    events = trace.get("traceEvents", trace if isinstance(trace, list) else [])
    ops = defaultdict(list)
    launches = {}
    step_names = defaultdict(int)
    step_host_us = 0.0
    runtime = defaultdict(lambda: [0.0, 0])  # CUDA runtime/driver call -> [µs, calls] (the host side of a step)
    step_re = re.compile(step_pattern)
    for e in events:
        if e.get("ph") != "X":
            continue
        cat = (e.get("cat") or "").lower()
        name = e.get("name", "")
        if cat in ("user_annotation",) and step_re.search(name):
            step_names[name] += 1
            step_host_us += float(e.get("dur", 0))
        elif cat == "cpu_op":
            for op_cat, pattern in _OP_RULES:
                if pattern.search(name):
                    ops[e.get("tid")].append((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), op_cat))
                    break
        elif cat == "cuda_runtime" or cat == "cuda_driver":
            runtime[name][0] += float(e.get("dur", 0))
            runtime[name][1] += 1
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None:
                launches[corr] = (e.get("tid"), float(e["ts"]))
    ops_by_tid = {}
    for tid, spans in ops.items():
        spans.sort()
        ops_by_tid[tid] = ([s[0] for s in spans], spans)
    kernel_us = dict.fromkeys(CATEGORIES, 0.0)
    count = dict.fromkeys(CATEGORIES, 0)
    per_name = defaultdict(lambda: [0.0, 0, ""])
    other_kinds = defaultdict(float)
    first, last, n_kernels = None, None, 0
    kernels = []
    for e in events:
        if e.get("ph") != "X" or (e.get("cat") or "").lower() != "kernel":
            continue
        name = e.get("name", "")
        cat = classify(name)
        if cat == "other" and ops_by_tid:
            launch = launches.get((e.get("args") or {}).get("correlation"))
            if launch is not None:
                cat = _op_category_at(ops_by_tid, *launch) or cat
        kernels.append([e.get("pid"), e.get("tid"), float(e["ts"]), float(e.get("dur", 0)), name, cat])
    _place_by_neighbours(kernels)
    for _pid, _tid, ts, dur, name, cat in kernels:
        kernel_us[cat] += dur
        count[cat] += 1
        n_kernels += 1
        entry = per_name[name]
        entry[0] += dur
        entry[1] += 1
        entry[2] = cat
        if cat == "other":
            other_kinds[other_kind(name)] += dur
        first = ts if first is None else min(first, ts)
        last = ts + dur if last is None else max(last, ts + dur)
    steps = sum(step_names.values())
    top = defaultdict(list)
    for name, (us, n, cat) in sorted(per_name.items(), key=lambda kv: -kv[1][0]):
        if len(top[cat]) < 6:
            top[cat].append([name[:120], round(us, 1), n])
    return {"steps": steps, "step_names": dict(step_names), "kernels": n_kernels,
            "kernel_us": {k: round(v, 1) for k, v in kernel_us.items()}, "count": count,
            "per_step_us": {k: round(v / steps, 2) for k, v in kernel_us.items()} if steps else {},
            "total_us": round(sum(kernel_us.values()), 1),
            "gpu_span_us": round(last - first, 1) if first is not None else 0.0,
            "top": dict(top), "other_kinds": {k: round(v, 1) for k, v in other_kinds.items()},
            # host side a step: the step annotations' own time, and the CUDA calls by name (eager launches show as
            # cudaLaunchKernel, waits for the GPU as *Synchronize / blocking copies), most time first
            "host_step_us": round(step_host_us / steps, 1) if steps else None,
            "runtime_per_step": {name: [round(us / steps, 1), round(n / steps, 1)] for name, (us, n) in
                                 sorted(runtime.items(), key=lambda kv: -kv[1][0])[:RUNTIME_TOP]} if steps else {}}


RUNTIME_TOP = 8  # CUDA runtime calls kept per trace


def _place_by_neighbours(kernels: list[list]) -> None:
    """In place, on [pid, tid, ts, dur, name, category] rows: on each stream in time order, vLLM's quantize_q8_1 takes
    the category of the GGUF kernel it feeds (the next kernel: ggml_moe_a8[_vec] quantizes too, not only the dense
    matmuls), the shim's register-MMA kernel is GGUF MoE right before (w13) or after (w2) the MoE's
    _silu_mul_splits_kernel and GGUF dense elsewhere, and a torch sum that directly follows the shim's
    _linear_kernel, _moe_kernel or _mma_kernel (the split-K or top-k sum), with the copy right after a dense
    linear's sum, takes that kernel's category."""
    streams = defaultdict(list)
    for row in kernels:
        streams[(row[0], row[1])].append(row)
    for rows in streams.values():
        rows.sort(key=lambda r: r[2])
        for i, row in enumerate(rows):
            beside = (rows[j][4] for j in (i - 1, i + 1) if 0 <= j < len(rows))
            if _MMA.search(row[4]) and any(_SILU_SPLITS.search(n) for n in beside):
                row[5] = "gguf_moe"
        owner = None  # (category, what may follow: "sum" | "copy", a copy after the sum)
        for i, row in enumerate(rows):
            name = row[4]
            if _QUANTIZE_Q8_1.search(name) and i + 1 < len(rows) and rows[i + 1][5] in ("gguf_moe", "gguf_dense"):
                row[5] = rows[i + 1][5]
            if owner and row[5] == "other" and (_SUM if owner[1] == "sum" else _COPY).search(name):
                row[5] = owner[0]
                # only the linear's float32 sum is copied back (out.copy_); the MoE sums into its output
                owner = (owner[0], "copy", False) if owner[1] == "sum" and owner[2] else None
            elif _SPLIT_K_PRODUCER.search(name):
                owner = (row[5], "sum", row[5] == "gguf_dense")
            else:
                owner = None


def newest_trace(directory: str | Path, after: float = 0.0) -> Path | None:
    """The newest worker trace vLLM's profiler wrote in `directory` (modified after `after`, a time.time())."""
    found = [p for p in Path(directory).glob("**/*.pt.trace.json*") if p.stat().st_mtime >= after]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None
