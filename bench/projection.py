"""Per-token time of the whole GLM-5 (78 layers: 3 dense + 75 MoE) at TP 8 on 8× RTX PRO 6000 Blackwell and on
8× H200, projected from the per-layer costs measured on a slice (issue #16).

    python bench/projection.py DIR/slice.json [--part a] [--prefill] [--json] [--rtx-bw-gbs 1800] ...
                               [--mtp-json MTP_DIR/mtp.json --mtp-k 3]

Input: bench/slice_serve.py's DIR/slice.json — the torch-profiler kernel time a decode step by group (GGUF MoE,
GGUF dense, attention, indexer, norms/rope/activation, sampling, other) of a rank-of-8 slice (what one rank computes
at TP 8) at 1 and 32 streams, the slice's weight bytes by group, and the measured time per output token (TPOT).
Every assumption is printed with the table; each constant has a flag. In short:
  * per layer: GGUF MoE time / MoE layers; attention, indexer, norms and "other" / all layers; GGUF dense time split
    by the bytes of the weights it reads (attention projections every layer, the dense FFN, the shared expert,
    lm_head once, left out of a prefill chunk's split: it runs on the last token alone); sampling once a step;
  * the full model = 75 × MoE layer + 3 × dense layer + lm_head + sampling (+ the per-layer time of the full
    model's own byte mix where glm5_shim can plan it: llama-quantize gives some layers other types);
  * bandwidth-bound groups scale by the measured H200 copy bandwidth over the target's; compute-bound groups by
    dense bf16 tensor throughput (decode: every group bandwidth-bound; --prefill: GGUF, attention, indexer compute);
  * two all-reduces a layer (attention output, FFN output) of 6144 × T bf16 values, one for the embedding, and one
    gather of the logits (rows × vocabulary / 8 values a rank; rows = T in decode, 1 for a prefill chunk of one
    request): latency + 2(N−1)/N × bytes / bus bandwidth (the gather: (N−1)/N × bytes);
  * the host's part of a step (TPOT measured on the H200 minus the kernel time a step) stays as measured;
  * --mtp-json: rows with MTP, the tokens/s times the factor bench/mtp.py measured on a GPU-bound slice.
A second decode table holds each group's time above its bandwidth floor (bytes the group must read ÷ the H200's
measured bandwidth) as it was on the H200 and scales only the floor: most decode kernels at one stream are launch-
and latency-bound (a 1.7 µs-floor o_proj takes 8 µs), and that part does not grow on a GPU with less bandwidth.
The first table (everything scaled) is the pessimistic end, the second the optimistic one.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

GROUPS = ("gguf_moe", "gguf_dense", "attention", "indexer", "norm_rope_act", "sampling", "other")
SGLANG_NVFP4_RTX_PRO_6000_TP8 = 51.6  # tokens/s, single stream (public figure quoted in issue #16)


@dataclass
class Gpu:
    name: str
    bandwidth_gbs: float  # memory bandwidth used for scaling
    bf16_tflops: float  # dense bf16 tensor throughput
    link: str
    allreduce_latency_us: float
    link_busbw_gbs: float  # all-reduce bus bandwidth between the 8 GPUs


@dataclass
class Assumptions:
    layers: int = 78
    dense_layers: int = 3
    tp: int = 8
    hidden: int = 6144
    vocab: int = 154880
    measured_bw_gbs: float = 4270.0  # H200 copy bandwidth measured on the device machine (bench/journal/)
    measured_tflops: float = 989.0  # H200 dense bf16, published
    targets: list = field(default_factory=lambda: [
        Gpu("8x RTX PRO 6000 Blackwell", 1800.0, 500.0, "PCIe 5.0 x16, no NVLink (NCCL ring)", 30.0, 25.0),
        Gpu("8x H200", 4270.0, 989.0, "NVLink 4 / NVSwitch (vLLM custom all-reduce)", 10.0, 360.0)])
    decode_compute_bound: tuple = ()
    prefill_compute_bound: tuple = ("gguf_moe", "gguf_dense", "attention", "indexer")
    # what a decode step must read besides the GGUF weights (the floors of the latency-held table)
    experts: int = 256
    top_k: int = 8
    index_topk: int = 2048
    kv_token_bytes: int = 1152  # the slice's bf16 MLA cache: 512 latent + 64 rope values a token a layer
    index_key_bytes: int = 132  # the indexer's key cache: 128 fp8 values + one float32 scale a token a layer

    def lines(self) -> list[str]:
        out = [f"model: {self.layers} layers ({self.dense_layers} dense, {self.layers - self.dense_layers} MoE), "
               f"hidden {self.hidden}, vocabulary {self.vocab}, TP {self.tp}; no MTP draft in the main table, no "
               "expert parallel",
               f"H200 reference: {self.measured_bw_gbs:.0f} GB/s (measured copy), {self.measured_tflops:.0f} TFLOPS "
               "dense bf16 (published)"]
        for g in self.targets:
            out.append(f"{g.name}: {g.bandwidth_gbs:.0f} GB/s, {g.bf16_tflops:.0f} TFLOPS dense bf16; {g.link}: "
                       f"{g.allreduce_latency_us:.0f} µs a collective + bytes at {g.link_busbw_gbs:.0f} GB/s bus "
                       "bandwidth")
        out.append(f"decode floors (latency-held table): routed experts touched by T tokens = {self.experts} × "
                   f"(1 − (1 − {self.top_k}/{self.experts})^T) a MoE layer; attention reads min(context, "
                   f"{self.index_topk}) × {self.kv_token_bytes} B a token a layer, the indexer context × "
                   f"{self.index_key_bytes} B; 'other' reads the unquantized attention weights and the router; norms "
                   "and sampling nothing")
        out.append("decode: every kernel group scales with memory bandwidth"
                   + (f" except {', '.join(self.decode_compute_bound)} (tensor throughput)"
                      if self.decode_compute_bound else "")
                   + "; prefill: " + ", ".join(self.prefill_compute_bound) + " scale with tensor throughput, the "
                   "rest with bandwidth")
        out.append("the host's share of a step (measured TPOT − kernel time a step on the H200) is the same on "
                   "every machine (same CPU, CUDA graphs); kernels of different groups do not overlap")
        return out


def per_layer_costs(per_step_us: dict, groups: dict, prefill: bool = False) -> dict:
    """Kernel µs a step of one slice, split into what one MoE layer, one dense layer and the once-a-step parts cost.

    per_step_us: group → µs a step (slice_serve's profile); groups: slice_parts.weights.weight_groups of the slice.
    GGUF dense time is split by bytes read (decode reads each weight once a step); in a prefill chunk lm_head runs
    on the last token alone, so there the split leaves it out (it costs ~0 next to the layers' T-row matmuls)."""
    n, nd, nm = groups["layers"], groups["dense_layers"], groups["moe_layers"]
    lm_head = 0 if prefill else groups["lm_head"]
    dense_bytes = (n * groups["attn_gguf_per_layer"] + nd * groups["dense_ffn_per_dense_layer"]
                   + nm * groups["shared_expert_per_moe_layer"] + lm_head)
    per_byte = per_step_us.get("gguf_dense", 0.0) / dense_bytes if dense_bytes else 0.0
    common = {"gguf_dense": per_byte * groups["attn_gguf_per_layer"]}
    for g in ("attention", "indexer", "norm_rope_act", "other"):
        common[g] = per_step_us.get(g, 0.0) / n
    moe = dict(common, gguf_moe=per_step_us.get("gguf_moe", 0.0) / nm if nm else 0.0)
    moe["gguf_dense"] += per_byte * groups["shared_expert_per_moe_layer"]
    dense = dict(common)
    dense["gguf_dense"] += per_byte * groups["dense_ffn_per_dense_layer"]
    once = {"gguf_dense": per_byte * lm_head, "sampling": per_step_us.get("sampling", 0.0)}
    return {"moe_layer": moe, "dense_layer": dense, "once": once, "us_per_byte_gguf_dense": per_byte,
            "lm_head_bytes": lm_head}


def byte_scale(slice_groups: dict, full_groups: dict | None) -> dict:
    """Per-layer byte ratios full model / slice (llama-quantize's mix differs by layer); 1 where unknown."""
    keys = {"routed": "routed_per_moe_layer", "shared": "shared_expert_per_moe_layer",
            "dense_ffn": "dense_ffn_per_dense_layer", "attn": "attn_gguf_per_layer", "lm_head": "lm_head"}
    if not full_groups:
        return dict.fromkeys(keys, 1.0)
    return {k: (full_groups[v] / slice_groups[v] if slice_groups.get(v) else 1.0) for k, v in keys.items()}


def collective_us(gpu: Gpu, nbytes: float, ranks: int, kind: str = "all_reduce") -> float:
    """Ring all-reduce: 2(N−1)/N × bytes over the bus bandwidth; gather: (N−1)/N × the gathered bytes."""
    factor = 2 * (ranks - 1) / ranks if kind == "all_reduce" else (ranks - 1) / ranks
    return gpu.allreduce_latency_us + factor * nbytes / (gpu.link_busbw_gbs * 1e3)  # GB/s → bytes/µs = 1e3


def project_step(costs: dict, scale: dict, a: Assumptions, gpu: Gpu, tokens: int, host_us: float,
                 compute_bound: tuple, logit_rows: int | None = None, context: int = 0) -> dict:
    """µs a step of the full model on `gpu` (one rank of TP a.tp) with `tokens` tokens in the step, of which
    `logit_rows` (default: all, as in decode) get logits: a prefill chunk's request has one.  A decode step
    (context: its requests' tokens so far) also gets the latency-held variant (held_*)."""
    logit_rows = tokens if logit_rows is None else logit_rows
    bw_factor = a.measured_bw_gbs / gpu.bandwidth_gbs
    tf_factor = a.measured_tflops / gpu.bf16_tflops
    nm, nd = a.layers - a.dense_layers, a.dense_layers
    moe, dense, once, g = costs["moe_layer"], costs["dense_layer"], costs["once"], costs["groups"]
    by_group = {k: nm * moe.get(k, 0.0) + nd * dense.get(k, 0.0) + once.get(k, 0.0) for k in GROUPS}
    # the weight-reading GGUF groups follow the full model's own bytes a layer (scale: full / slice)
    by_group["gguf_moe"] = nm * moe.get("gguf_moe", 0.0) * scale["routed"]
    per_byte = costs["us_per_byte_gguf_dense"]
    lm_head_bytes = costs.get("lm_head_bytes", g["lm_head"])
    by_group["gguf_dense"] = per_byte * dense_weight_bytes(a, g, scale, lm_head_bytes)
    scaled = {k: v * (tf_factor if k in compute_bound else bw_factor) for k, v in by_group.items()}
    kernels = sum(scaled.values())
    held = None
    if context:
        floors = floor_bytes(a, g, scale, tokens, context, lm_head_bytes)
        held = {k: max(v - floors.get(k, 0.0) / (a.measured_bw_gbs * 1e3), 0.0)
                + floors.get(k, 0.0) / (gpu.bandwidth_gbs * 1e3) for k, v in by_group.items()}
    act_bytes = a.hidden * tokens * 2
    comm = (2 * a.layers + 1) * collective_us(gpu, act_bytes, a.tp)
    comm += collective_us(gpu, logit_rows * a.vocab * 2, a.tp, kind="gather")
    total = kernels + comm + host_us
    row = {"gpu": gpu.name, "tokens": tokens, "h200_us_by_group": {k: round(v, 1) for k, v in by_group.items()},
           "scaled_us_by_group": {k: round(v, 1) for k, v in scaled.items()}, "kernels_us": round(kernels, 1),
           "comm_us": round(comm, 1), "host_us": round(host_us, 1), "step_us": round(total, 1),
           "per_stream_tok_s": round(1e6 / total, 2), "aggregate_tok_s": round(tokens * 1e6 / total, 1)}
    if held is not None:
        held_total = sum(held.values()) + comm + host_us
        row.update(held_us_by_group={k: round(v, 1) for k, v in held.items()},
                   held_kernels_us=round(sum(held.values()), 1), held_step_us=round(held_total, 1),
                   held_per_stream_tok_s=round(1e6 / held_total, 2),
                   held_aggregate_tok_s=round(tokens * 1e6 / held_total, 1))
    return row


def dense_weight_bytes(a: Assumptions, g: dict, scale: dict, lm_head_bytes: float) -> float:
    """The full model's GGUF dense weight bytes at one rank: attention projections, shared experts, dense FFNs,
    lm_head (lm_head_bytes: 0 for a prefill chunk's split)."""
    nm, nd = a.layers - a.dense_layers, a.dense_layers
    return (a.layers * g["attn_gguf_per_layer"] * scale["attn"]
            + nm * g["shared_expert_per_moe_layer"] * scale["shared"]
            + nd * g["dense_ffn_per_dense_layer"] * scale["dense_ffn"] + lm_head_bytes * scale["lm_head"])


def floor_bytes(a: Assumptions, g: dict, scale: dict, tokens: int, context: int, lm_head_bytes: float) -> dict:
    """Bytes one rank's decode step of the full model must read, by group (g: the slice's bytes by group, scale:
    full model / slice a layer): the floor of each group's time."""
    nm = a.layers - a.dense_layers
    touched = 1 - (1 - a.top_k / a.experts) ** tokens  # share of the experts T tokens route to (uniform routing)
    return {"gguf_moe": nm * g["routed_per_moe_layer"] * scale["routed"] * touched,
            "gguf_dense": dense_weight_bytes(a, g, scale, lm_head_bytes),
            "attention": a.layers * tokens * min(context, a.index_topk) * a.kv_token_bytes,
            "indexer": a.layers * tokens * context * a.index_key_bytes,
            "other": a.layers * g.get("attn_other_per_layer", 0) + nm * g.get("router_per_moe_layer", 0)}


def host_share_us(part: dict, concurrency: int, kernel_us: float) -> tuple[float, str]:
    row = next((r for r in part.get("decode", []) if r["concurrency"] == concurrency and r.get("tpot_ms")), None)
    if row is None:
        return 0.0, f"no decode row at concurrency {concurrency}: host share taken as 0"
    return max(row["tpot_ms"] * 1e3 - kernel_us, 0.0), (f"TPOT {row['tpot_ms']} ms at concurrency {concurrency} "
                                                         f"(prompt {row['in_len']}) − kernels {kernel_us / 1e3:.3f} ms")


def decode_context(part: dict, concurrency: int) -> int:
    """The context of the measured decode steps: the decode row's prompt length (its outputs are short)."""
    row = next((r for r in part.get("decode", []) if r["concurrency"] == concurrency), None)
    return int(row["in_len"]) if row else 2048


def project(results: dict, part_key: str = "a", a: Assumptions | None = None, prefill: bool = False,
            full_groups: dict | None = None) -> dict:
    a = a or Assumptions()
    if part_key not in results.get("parts", {}):
        raise SystemExit(f"no part {part_key!r} in the results (parts: {', '.join(results.get('parts', {}))})")
    part = results["parts"][part_key]
    sl = results["slices"][part["slice"]]
    groups = sl["bytes_by_group"]
    if sl.get("rank_of") != a.tp:
        raise SystemExit(f"part {part_key} ran slice {part['slice']} (rank of {sl.get('rank_of')}); the projection "
                         f"needs the rank-of-{a.tp} slice: one rank's per-layer costs")
    scale = byte_scale(groups, full_groups)
    out = {"part": part_key, "slice": part["slice"], "path": part.get("path"), "kernels": part.get("kernels"),
           "assumptions": a.lines(), "byte_scale": scale, "rows": [], "notes": [],
           "reference": f"SGLang, NVFP4 weights, 8x RTX PRO 6000: {SGLANG_NVFP4_RTX_PRO_6000_TP8} tokens/s single "
                        "stream"}
    windows = [("prefill", None)] if prefill else [("decode_c1", 1), ("decode_c32", 32)]
    for window, streams in windows:
        prof = part.get("profile", {}).get(window)
        if not prof or not prof.get("per_step_us"):
            out["notes"].append(f"{window}: not measured")
            continue
        costs = per_layer_costs(prof["per_step_us"], groups, prefill=not streams)
        costs["groups"] = groups
        slice_kernel_us = sum(prof["per_step_us"].values())
        if streams:
            host, why = host_share_us(part, streams, slice_kernel_us)
            tokens, bound = streams, a.decode_compute_bound
        else:
            host, why = 0.0, ("prefill: host share ignored; one request a chunk: logits (lm_head, gather) for its "
                              "last token alone")
            tokens, bound = prof.get("in_len", 8192), a.prefill_compute_bound
        out["notes"].append(f"{window}: slice kernels {slice_kernel_us / 1e3:.3f} ms a step; host share: {why}")
        out["per_layer_us_" + window] = {k: ({g: round(v, 2) for g, v in d.items()} if isinstance(d, dict) else d)
                                         for k, d in costs.items() if k != "groups"}
        for gpu in a.targets:
            row = project_step(costs, scale, a, gpu, tokens, host, bound, logit_rows=streams or 1,
                               context=decode_context(part, streams) if streams else 0)
            row.update(window=window, streams=streams)
            out["rows"].append(row)
    return out


def mtp_factors(mtp_results: dict, k: int) -> dict:
    """Output tokens/s with K MTP drafts over K=0 on the same model and path, by concurrency, with the acceptance,
    from a `bench/mtp.py run --slice ...` mtp.json (a GPU-bound slice: a speculative step's cost is GPU time)."""
    arms = mtp_results.get("arms", {})
    with_k = [arms[n] for n in sorted(arms) if arms[n].get("k") == k and arms[n].get("throughput")]  # first by name
    if not with_k:
        raise SystemExit(f"no K={k} arm with a throughput table in the MTP results")
    arm = with_k[0]
    base = next((a for a in arms.values() if a.get("k") == 0 and a.get("model") == arm["model"]
                 and a.get("path") == arm["path"] and a.get("throughput")), None)
    if base is None:
        raise SystemExit(f"no K=0 arm of {arm['model']} ({arm['path']}) to compare K={k} with")
    out = {"k": k, "model": arm["model"], "slice": mtp_results.get("slice"), "by_streams": {}}
    for c, row in arm["throughput"].items():
        b = base["throughput"].get(c, {}).get("output_tok_s")
        if b and row.get("output_tok_s"):
            out["by_streams"][int(c)] = {"factor": row["output_tok_s"] / b,
                                         "acceptance": row.get("metrics", {}).get("acceptance")}
    return out


def with_mtp(proj: dict, mtp: dict) -> dict:
    """The projection's tokens/s times the measured MTP factor at the same number of streams (rows of a window
    without a measured factor get none)."""
    sl = mtp.get("slice") or {}
    proj["assumptions"].append(
        f"MTP K={mtp['k']}: tokens/s times the factor measured on the H200 with K={mtp['k']} against none "
        f"({sl.get('layers', '?')}-layer rank-of-{sl.get('rank_of', '?')} {sl.get('preset', '?')} slice whose MTP "
        "layer drafts its greedy tokens), the same on every machine: a draft's acceptance, and a speculative step's "
        "cost relative to a plain one, depend on the model, not the GPU")
    proj["mtp"] = mtp
    for r in proj["rows"]:
        f = mtp["by_streams"].get(r.get("streams"))
        if f:
            r["mtp_factor"] = round(f["factor"], 3)
            r["mtp_acceptance"] = f["acceptance"]
            r["mtp_per_stream_tok_s"] = round(r["per_stream_tok_s"] * f["factor"], 1)
            r["mtp_aggregate_tok_s"] = round(r["aggregate_tok_s"] * f["factor"], 1)
            if "held_per_stream_tok_s" in r:
                r["mtp_held_per_stream_tok_s"] = round(r["held_per_stream_tok_s"] * f["factor"], 1)
                r["mtp_held_aggregate_tok_s"] = round(r["held_aggregate_tok_s"] * f["factor"], 1)
    return proj


def full_model_groups(results: dict, part_key: str, a: Assumptions) -> dict:
    """The full model's bytes by group at one rank (glm5_shim's slice planner).  A failure stops the projection
    (--no-full-bytes assumes the slice's bytes a layer instead): the 2026-12-03 projection had silently fallen back to
    the slice's bytes, 31.3 tok/s single stream where the full model's byte mix gives 31.5."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from slice_parts.weights import plan_groups

    sl = results["slices"][results["parts"][part_key]["slice"]]
    try:
        return plan_groups(a.layers, a.dense_layers, sl["preset"], a.tp)
    except Exception as exc:  # noqa: BLE001 - one line naming what failed
        raise SystemExit(f"the full model's bytes a layer could not be planned for preset {sl['preset']!r} "
                         f"({type(exc).__name__}: {exc}); --no-full-bytes assumes the slice's") from exc


def format_projection(p: dict) -> str:
    lines = [f"# Projection of GLM-5 (78 layers, TP 8) from part {p['part']} ({p['slice']}, {p['path']} arm, GGUF "
             f"kernels {p['kernels']})", "", "Assumptions:"] + [f"  - {x}" for x in p["assumptions"]]
    lines += ["  - full model / slice bytes a layer: " + ", ".join(f"{k} {v:.3f}" for k, v in p["byte_scale"].items())]
    lines += [f"  - {n}" for n in p["notes"]]
    lines += ["", "| machine | window | tokens a step | kernels ms | all-reduce ms | host ms | step ms "
              "| tok/s a stream | tok/s in all |", "|---|---|---|---|---|---|---|---|---|"]
    for r in p["rows"]:
        lines.append(f"| {r['gpu']} | {r['window']} | {r['tokens']} | {r['kernels_us'] / 1e3:.3f} | "
                     f"{r['comm_us'] / 1e3:.3f} | {r['host_us'] / 1e3:.3f} | {r['step_us'] / 1e3:.3f} | "
                     f"{r['per_stream_tok_s']} | {r['aggregate_tok_s']} |")
    held = [r for r in p["rows"] if "held_step_us" in r]
    if held:
        lines += ["", "Latency held (optimistic end): each group's time above its bandwidth floor as on the H200, "
                  "only the floor scaled:", "",
                  "| machine | window | kernels ms | step ms | tok/s a stream | tok/s in all |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {r['gpu']} | {r['window']} | {r['held_kernels_us'] / 1e3:.3f} | {r['held_step_us'] / 1e3:.3f} | "
                  f"{r['held_per_stream_tok_s']} | {r['held_aggregate_tok_s']} |" for r in held]
    mtp_rows = [r for r in p["rows"] if "mtp_factor" in r]
    if mtp_rows:
        acc = lambda r: f"{r['mtp_acceptance']:.2f}" if r.get("mtp_acceptance") is not None else "?"  # noqa: E731
        lines += ["", f"With MTP, K={p['mtp']['k']} (measured factor):", "",
                  "| machine | window | factor (acceptance) | tok/s a stream | tok/s in all | latency held: a stream "
                  "| in all |", "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['gpu']} | {r['window']} | x{r['mtp_factor']:.2f} ({acc(r)}) | {r['mtp_per_stream_tok_s']} | "
                  f"{r['mtp_aggregate_tok_s']} | {r.get('mtp_held_per_stream_tok_s', '-')} | "
                  f"{r.get('mtp_held_aggregate_tok_s', '-')} |" for r in mtp_rows]
    lines += ["", f"Reference: {p['reference']}.", "", "Kernel ms a step by group (projected):", ""]
    for r in p["rows"]:
        lines.append(f"- {r['gpu']}, {r['window']}: " + ", ".join(f"{k} {v / 1e3:.3f}"
                                                                  for k, v in r["scaled_us_by_group"].items()))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    d = Assumptions()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("slice_json")
    p.add_argument("--part", default="a", help="which part's profile (a: shim arm; b: native, for the H200 row)")
    p.add_argument("--prefill", action="store_true", help="project the prefill chunk instead of decode")
    p.add_argument("--json", action="store_true")
    p.add_argument("--no-full-bytes", action="store_true", help="assume the slice's bytes a layer for the full model")
    p.add_argument("--h200-bw-gbs", type=float, default=d.measured_bw_gbs)
    p.add_argument("--h200-tflops", type=float, default=d.measured_tflops)
    p.add_argument("--rtx-bw-gbs", type=float, default=d.targets[0].bandwidth_gbs)
    p.add_argument("--rtx-tflops", type=float, default=d.targets[0].bf16_tflops)
    p.add_argument("--pcie-latency-us", type=float, default=d.targets[0].allreduce_latency_us)
    p.add_argument("--pcie-busbw-gbs", type=float, default=d.targets[0].link_busbw_gbs)
    p.add_argument("--nvlink-latency-us", type=float, default=d.targets[1].allreduce_latency_us)
    p.add_argument("--nvlink-busbw-gbs", type=float, default=d.targets[1].link_busbw_gbs)
    p.add_argument("--mtp-json", default="", help="a bench/mtp.py --slice run's mtp.json: add rows with MTP's factor")
    p.add_argument("--mtp-k", type=int, default=1, help="which K of --mtp-json")
    args = p.parse_args(argv)
    rtx, h200 = d.targets
    a = Assumptions(measured_bw_gbs=args.h200_bw_gbs, measured_tflops=args.h200_tflops, targets=[
        Gpu(rtx.name, args.rtx_bw_gbs, args.rtx_tflops, rtx.link, args.pcie_latency_us, args.pcie_busbw_gbs),
        Gpu(h200.name, args.h200_bw_gbs, args.h200_tflops, h200.link, args.nvlink_latency_us, args.nvlink_busbw_gbs)])
    results = json.loads(Path(args.slice_json).read_text())
    full = None if args.no_full_bytes else full_model_groups(results, args.part, a)
    proj = project(results, args.part, a, prefill=args.prefill, full_groups=full)
    if args.mtp_json:
        proj = with_mtp(proj, mtp_factors(json.loads(Path(args.mtp_json).read_text()), args.mtp_k))
    if args.json:
        proj["constants"] = asdict(a)
        print(json.dumps(proj, indent=1))
    else:
        print(format_projection(proj))
    return 0


if __name__ == "__main__":
    sys.exit(main())
