"""Summarise a glm-dsa GGUF: config, tensor types, validator findings, GPU weight memory and KV-cache size.

Weight memory per GPU for tensor parallel size TP:
  * divided by TP: column/row-parallel linears (attn_q_b, kv_b, attn_output, dense and shared-expert FFN),
    routed experts (split by TP or EP either way), the vocab embedding and lm_head;
  * replicated on every GPU: norms, the DSA indexer (wq_b, wk, weights_proj, k_norm), the fused
    q_a/kv_a projection (vLLM builds it with disable_tp), the router and its bias;
  * bytes: what the load plan hands vLLM (glm5_shim.gguf.type_policy.gpu_bytes): quantized tensors kept as they are
    take their GGUF size, re-quantized experts their Q8_0 size; float tensors, and the ones the loader turns into
    float (kv_b rebuilt from attn_k_b + attn_v_b, indexer wk / weights_proj, types vLLM has no kernel for), take
    2 bytes per value (bfloat16); a tensor the plan refuses counts as it is in the file.
  * what the loader skips is not counted: the MTP block, the indexer tensors of GLM-5.2's shared-indexer layers
    where a file has them, tensors GLM-5 does not use.  The MTP block's own figure ("mtp") is what vLLM's MTP draft
    adds with --speculative-config method mtp (the draft's load plan, same rules; it shares the target's
    embedding and lm_head).
KV cache per token (MLA keeps one latent per token, replicated across TP ranks; rules in glm5_shim.gguf.memory):
  * MLA latent, every trunk layer: (kv_lora + rope) values x 2 bytes in bf16 = 1152 B for GLM-5, or fp8_ds_mla:
    kv_lora fp8 bytes + 4-byte scale per 128 values + rope x 2 bytes = 656 B;
  * DSA indexer keys, only in the layers that run their own indexer (all but GLM-5.2's shared ones, which the shim
    gives no indexer cache): index_head_dim fp8 bytes + 4-byte scale per 128 values = 132 B.
The longest --max-model-len per GPU for each TP size and KV dtype: glm5_shim.gguf.memory.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import gguf

from glm5_shim import settings

from glm5_shim.gguf.config import build_hf_config, indexer_layout
from glm5_shim.kernels.gguf.routing import (LOAD_PACKED_TYPES, MMA_DECODE_TYPES, VLLM_LINEAR_ROWS_TEXT,
                                            VLLM_MISDECODED_TYPES, VLLM_MOE_DECODE_TOKENS, matmul_paths,
                                            mma_moe_rows_text)
from glm5_shim.gguf.errors import GGUFError
from glm5_shim.gguf.load_plan import MTP_FLAG, LoadPlan, mtp_draft_problem, plan_load, plan_tensors
from glm5_shim.gguf import memory
from glm5_shim.gguf.memory import GIB, ServeAssumptions, context_table, format_context_table
from glm5_shim.gguf.reader import GLM_DSA_ARCH, GGUFModel, open_gguf
from glm5_shim.gguf.tensor_map import ROLE_EXPERTS, TP_REPLICATED, build_tensor_map
from glm5_shim.gguf.tp_split import clean_tp_sizes, split_problems
from glm5_shim.gguf.type_policy import ACTIONS, KEEP, gpu_bytes
from glm5_shim.gguf.validate import validate_model

TP_SIZES = (1, 2, 4, 8)


def weight_bytes_per_gpu(model: GGUFModel, config: dict[str, Any], tp_sizes=TP_SIZES,
                         plan: LoadPlan | None = None) -> dict[int, int]:
    """Bytes of weights each GPU holds for each TP size (rule in the module docstring).  plan: plan_tensors's."""
    plan = plan if plan is not None else plan_tensors(model, config)
    sized = [(t.spec, gpu_bytes(t.action, t.info)) for t in plan.tensors]
    sized += [(r.spec, gpu_bytes(KEEP, r.info)) for r in plan.refused]  # as it is in the file
    sharded, replicated = 0, 0
    for spec, size in sized:
        if spec is not None and spec.tp_split != TP_REPLICATED:  # the tensor table says how vLLM splits it
            sharded += size
        else:
            replicated += size
    return {tp: replicated + -(-sharded // tp) for tp in tp_sizes}


def load_actions(plan: LoadPlan) -> dict[str, int]:
    """How many tensors the loader treats each way (type_policy's actions), and how many it refuses."""
    counts = Counter(t.action for t in plan.tensors)
    out = {action: counts[action] for action in ACTIONS if counts[action]}
    if plan.refused:
        out["refused"] = len(plan.refused)
    return out


def format_matmul_paths(paths: dict[str, dict[str, int]]) -> str:
    def listed(counts):
        return ", ".join(f"{t} x{n}" for t, n in counts.items()) or "none"

    hint = ("GLM5_SHIM_GGUF_KERNELS=vllm puts them all on vLLM's" if settings.gguf_kernels_choice() == "shim"
            else "GLM5_SHIM_GGUF_KERNELS=vllm")
    mma = [t for t in paths["shim"] if int(gguf.GGMLQuantizationType[t]) in MMA_DECODE_TYPES]
    if mma and settings.gguf_decode_choice() == "mma":
        rows = mma_moe_rows_text(int(gguf.GGMLQuantizationType[t]) for t in mma)
        decode = (f"; decode-sized {'/'.join(mma)} products (MoEs up to {rows} routed rows an expert) on the "
                  "register-MMA kernels (GLM5_SHIM_GGUF_DECODE=tile for the tile kernels)")
    else:
        decode = (f"; GLM5_SHIM_GGUF_DECODE=mma (the default) runs decode-sized {'/'.join(mma)} products on the "
                  "register-MMA kernels") if mma else ""
    iq = [t for t in paths["shim"] if int(gguf.GGMLQuantizationType[t]) in VLLM_MOE_DECODE_TOKENS]
    iq_note = f" and {'/'.join(iq)} MoE decode of up to 8-32 tokens" if iq else ""
    rows_note = (f"dense linears at {VLLM_LINEAR_ROWS_TEXT}{iq_note} stay on vLLM's vector kernels in fp16 or below "
                 "compute capability 10; ") if paths["shim"] else ""
    wrong = [t for t in paths["vllm"] if int(gguf.GGMLQuantizationType[t]) in VLLM_MISDECODED_TYPES]
    warning = (f"; WARNING: vLLM 0.23's kernels decode {'/'.join(wrong)} wrongly (an outdated grid: ~2 % error a "
               "matrix), the shim's kernels (GLM5_SHIM_GGUF_KERNELS=shim) do not") if wrong else ""
    packs = [t for t in paths["shim"] if int(gguf.GGMLQuantizationType[t]) in LOAD_PACKED_TYPES]
    if packs and settings.gguf_kernels_choice() == "shim" and settings.gguf_pack():
        repack = (f"; {'/'.join(packs)} linear and expert weights repacked at load for aligned code loads, the "
                  "same bytes moved, never on vLLM's kernels (GLM5_SHIM_GGUF_PACK=0 keeps the file's layout)")
    else:
        repack = ""
    return (f"GGUF matmuls: shim kernels {listed(paths['shim'])}; vLLM's ggml kernels {listed(paths['vllm'])} "
            f"({rows_note}{hint}{decode}{repack}{warning})")


def mtp_report(model: GGUFModel, config: dict[str, Any], tp_sizes=TP_SIZES) -> dict[str, Any]:
    """Whether the file can serve vLLM's MTP draft (--speculative-config method mtp), and what the draft adds per
    GPU: {"layers", "tensors" (of the block in the file), "file_bytes", "available", "problem" (the one line
    mtp_draft_problem gives, or None), "flag", "weight_bytes_per_gpu" (when available)}."""
    first = config["num_hidden_layers"]
    layers = list(range(first, first + config["num_nextn_predict_layers"]))
    prefixes = tuple(f"blk.{layer}." for layer in layers)
    present = [t for t in model if prefixes and t.name.startswith(prefixes)]
    problem = mtp_draft_problem(model, config)
    out: dict[str, Any] = {"layers": layers, "tensors": len(present), "file_bytes": sum(t.n_bytes for t in present),
                           "available": problem is None, "problem": problem, "flag": MTP_FLAG}
    if problem is None:
        plan = plan_load(model, config, draft=True)
        out["weight_bytes_per_gpu"] = {str(tp): b for tp, b in
                                       weight_bytes_per_gpu(model, config, tp_sizes, plan=plan).items()}
        # the draft's own KV cache: its layers' MLA latent and indexer keys, a token
        per_layer = memory.indexer_bytes_per_token(config)
        out["kv_cache_bytes_per_token"] = {
            "bf16": len(layers) * (memory.mla_bytes_per_token(config, "bf16") + per_layer),
            "fp8_ds_mla": len(layers) * (memory.mla_bytes_per_token(config, "fp8_ds_mla") + per_layer)}
    return out


def format_mtp(mtp: dict[str, Any]) -> str:
    """One line: the MTP layer, what enabling it costs per GPU and the flag; or why the file cannot serve it."""
    if not mtp["available"]:
        return f"MTP speculative decoding: unavailable: {mtp['problem']}"
    per_gpu = mtp["weight_bytes_per_gpu"]
    return (f"MTP layer {' '.join(f'blk.{layer}' for layer in mtp['layers'])}: {mtp['tensors']} tensors, "
            f"{_size(mtp['file_bytes'])} in the file (the target model skips it); as vLLM's MTP draft it adds "
            + ", ".join(f"TP{tp} {_size(b)}" for tp, b in per_gpu.items())
            + f" per GPU and {mtp['kv_cache_bytes_per_token']['bf16']} B of KV cache a token "
              f"({mtp['kv_cache_bytes_per_token']['fp8_ds_mla']} B fp8_ds_mla): enable with {mtp['flag']}")


def kv_cache_bytes_per_token(config: dict[str, Any], indexer_layers: int | None = None) -> dict[str, int]:
    """KV-cache bytes per token on each rank (rule in the module docstring).  indexer_layers: the layers that keep
    an indexer K cache; default: the full ones of config["indexer_types"], all layers without it."""
    if indexer_layers is None:
        indexer_layers = memory.indexer_layers(config)
    return {
        "layers": config["num_hidden_layers"],
        "mla_bf16_per_layer": memory.mla_bytes_per_token(config, "bf16"),
        "mla_fp8_ds_mla_per_layer": memory.mla_bytes_per_token(config, "fp8_ds_mla"),
        "indexer_per_layer": memory.indexer_bytes_per_token(config),
        "indexer_layers": indexer_layers,
        "total_bf16": memory.kv_bytes_per_token(config, "bf16", indexer_layers),
        "total_fp8_ds_mla": memory.kv_bytes_per_token(config, "fp8_ds_mla", indexer_layers),
    }


# What the shim does for a GGUF of another architecture (the shim is active in every vLLM process of its environment,
# whatever model is served; issue #51): doctor and inspect say it in one line.
OTHER_MODEL_NOTE = ("not a GLM-5 (glm-dsa) GGUF: glm5-shim leaves it to vLLM — vLLM's own config, tokenizer, loader "
                    "and GGUF kernels serve it as without the shim; the shim's rules that touch every GGUF: "
                    "--dtype auto is float16 on compute capability 10 or above (where vLLM 0.23 refuses bfloat16 "
                    "for GGUF), a merged linear's integer shards are applied in shard order, and speculator "
                    "detection is skipped (a GGUF carries none)")


def is_other_architecture(arch: str | None) -> bool:
    """A GGUF's general.architecture names another model than glm-dsa (None: the header cannot say, and the
    validator names what is wrong)."""
    return bool(arch) and arch != GLM_DSA_ARCH


def other_architecture(path: str | Path) -> str | None:
    """The file's general.architecture when it is a readable GGUF of another architecture than glm-dsa; else None."""
    from glm5_shim.gguf.probe import gguf_architecture

    arch = gguf_architecture(path)
    return arch if is_other_architecture(arch) else None


def file_facts(model: GGUFModel) -> dict[str, Any]:
    """What inspect says of any GGUF, whatever its architecture: files, sizes, tensor types and their bytes, and the
    tensors that point at another's bytes."""
    by_type: Counter = Counter()
    for info in model:
        by_type[info.type_name] += info.n_bytes
    facts: dict[str, Any] = {
        "path": str(model.path), "shards": [str(p) for p in model.paths], "file_bytes": model.file_size,
        "architecture": model.architecture, "tensor_count": len(model.tensors),
        "tensor_types": dict(sorted(Counter(t.type_name for t in model).items())),
        "tensor_bytes_by_type": dict(sorted(by_type.items())),
    }
    shared, tensor_bytes = model.shared_data()
    if shared:
        facts["shared_data"] = {"tensors": shared, "tensor_bytes": tensor_bytes}
    return facts


def other_model_report(path: str | Path) -> dict[str, Any]:
    """inspect's report of another architecture's GGUF: the file's facts and OTHER_MODEL_NOTE, no findings."""
    try:
        model = open_gguf(path, expected_architecture=None)
    except GGUFError as exc:
        return {"path": str(path), "error": str(exc), "findings": [{"level": "error", "message": str(exc)}]}
    return {**file_facts(model), "findings": [], "other_model": OTHER_MODEL_NOTE}


def inspect_report(path: str | Path, assume: ServeAssumptions = ServeAssumptions()) -> dict[str, Any]:
    """Everything `format_report` prints, as plain data (JSON-serialisable).  assume: the GPU and `vllm serve`
    settings of the longest-context table."""
    if other_architecture(path) is not None:
        return other_model_report(path)
    try:
        model = open_gguf(path, expected_architecture=GLM_DSA_ARCH)
    except GGUFError as exc:
        return {"path": str(path), "error": str(exc), "findings": [{"level": "error", "message": str(exc)}]}
    return inspect_model(model, assume)


def inspect_model(model: GGUFModel, assume: ServeAssumptions = ServeAssumptions()) -> dict[str, Any]:
    """inspect_report of an opened model."""
    report: dict[str, Any] = {
        **file_facts(model),
        "findings": [{"level": f.level, "message": f.message} for f in validate_model(model)],
    }
    try:
        config = build_hf_config(model, check_shapes=False)
    except GGUFError as exc:
        report["error"] = str(exc)
        return report
    report["config"] = config
    tensor_map = build_tensor_map(config, include_mtp=True)
    report["roles"] = dict(sorted(Counter(
        (tensor_map[t.name].role if t.name in tensor_map else "unknown") for t in model).items()))
    report["mtp_bytes"] = sum(t.n_bytes for t in model if t.name in tensor_map and tensor_map[t.name].is_mtp)
    report["mtp"] = mtp_report(model, config)
    report["experts_bytes"] = sum(t.n_bytes for t in model
                                  if t.name in tensor_map and tensor_map[t.name].base_role == ROLE_EXPERTS)
    layout = indexer_layout(model, config["num_hidden_layers"])
    report["indexer_layout"] = {"pattern": layout.pattern, "full_layers": sum(layout.full),
                                "shared_layers": len(layout.shared_layers), "description": layout.describe()}
    plan = plan_tensors(model, config)
    report["load_actions"] = load_actions(plan)
    report["matmul_paths"] = matmul_paths(plan, shim_kernels=settings.gguf_kernels_choice() == "shim")
    weights = weight_bytes_per_gpu(model, config, plan=plan)
    report["weight_bytes_per_gpu"] = {str(tp): b for tp, b in weights.items()}
    report["kv_cache_bytes_per_token"] = kv_cache_bytes_per_token(config, sum(layout.full))
    report["longest_context"] = context_table(config, weights, assume)
    try:
        plan = plan_load(model, config)
    except GGUFError as exc:  # the validator's findings already say why
        report["tp_split"] = {"error": str(exc)}
        return report
    report["tp_split"] = {
        "clean": clean_tp_sizes(plan, TP_SIZES),
        "clean_with_expert_parallel": clean_tp_sizes(plan, TP_SIZES, expert_parallel=True),
        "first_problem": {str(tp): problems[0].line(str(model.path))
                          for tp in TP_SIZES if (problems := split_problems(plan, tp))}}
    return report


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)


def format_report(report: dict[str, Any]) -> str:
    lines = [f"GGUF: {report['path']}"]
    if "architecture" not in report:
        lines.append(f"ERROR: {report.get('error')}")
        return "\n".join(lines)
    if len(report.get("shards", [])) > 1:
        lines.append(f"shards: {len(report['shards'])}")
    lines.append(f"architecture: {report['architecture']}   size: {_size(report['file_bytes'])}   "
                 f"tensors: {report['tensor_count']}")
    if report.get("shared_data"):
        lines.append(f"shared data: {report['shared_data']['tensors']} tensors point at another tensor's bytes "
                     f"(make-slice --shared-data): {_size(report['shared_data']['tensor_bytes'])} of tensors, each "
                     f"loaded as its own; llama.cpp reads only plain files (make-slice --plain-copy-of)")
    lines.append("tensor types: " + ", ".join(
        f"{name} x{count} ({_size(report['tensor_bytes_by_type'][name])})"
        for name, count in report["tensor_types"].items()))
    if report.get("other_model"):
        lines.append(report["other_model"])
        return "\n".join(lines)
    config = report.get("config")
    if config:
        lines.append("config:")
        for key in ("num_hidden_layers", "num_nextn_predict_layers", "hidden_size", "num_attention_heads",
                    "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                    "index_n_heads", "index_head_dim", "index_topk", "n_routed_experts", "num_experts_per_tok",
                    "n_shared_experts", "moe_intermediate_size", "intermediate_size", "first_k_dense_replace",
                    "vocab_size", "max_position_embeddings", "tie_word_embeddings"):
            lines.append(f"  {key}: {config[key]}")
        lines.append("tensor roles: " + ", ".join(f"{k} x{v}" for k, v in report["roles"].items()))
        lines.append(format_mtp(report["mtp"]))
        lines.append("loader: " + ", ".join(f"{action} x{n}" for action, n in report["load_actions"].items()))
    if report.get("matmul_paths"):
        lines.append(format_matmul_paths(report["matmul_paths"]))
        lines.append("weights per GPU (skipped tensors excluded; TP-split: q_b/kv_b/o_proj/FFN/experts/embedding/"
                     "lm_head; replicated: norms/indexer/q_a+kv_a/router; float as bf16):")
        for tp, size in report["weight_bytes_per_gpu"].items():
            lines.append(f"  TP{tp}: {_size(size)}")
        split = report.get("tp_split", {})
        if "clean" in split:
            lines.append(f"tensor-parallel sizes whose row-parallel weights split on whole blocks: "
                         f"{', '.join(map(str, split['clean'])) or 'none'}"
                         + (" (with --enable-expert-parallel: "
                            f"{', '.join(map(str, split['clean_with_expert_parallel']))})"
                            if split["clean_with_expert_parallel"] != split["clean"] else ""))
            for tp, line in split["first_problem"].items():
                lines.append(f"  TP{tp}: {line}")
        lines.append(f"DSA indexer: {report['indexer_layout']['description']}")
        kv = report["kv_cache_bytes_per_token"]
        lines.append(f"KV cache per token (same on every TP rank): bf16 {kv['total_bf16']} B, fp8_ds_mla "
                     f"{kv['total_fp8_ds_mla']} B (MLA {kv['mla_bf16_per_layer']} / {kv['mla_fp8_ds_mla_per_layer']} B "
                     f"in each of {kv['layers']} layers + indexer {kv['indexer_per_layer']} B in "
                     f"{kv['indexer_layers']} layers)")
        lines.extend(format_context_table(report["longest_context"]))
    findings = report.get("findings", [])
    errors = sum(f["level"] == "error" for f in findings)
    lines.append(f"findings: {errors} error(s), {len(findings) - errors} warning(s)")
    for finding in findings:
        lines.append(f"  {finding['level']}: {finding['message']}")
    if report.get("error") and config is None:
        lines.append(f"ERROR: {report['error']}")
    return "\n".join(lines)


def add_inspect_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("path", metavar="MODEL.gguf", help="a .gguf file, or the first shard of a split model")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    default = ServeAssumptions()
    parser.add_argument("--gpu-memory", type=float, metavar="GIB", default=default.gpu_bytes / GIB,
                        help="memory of each GPU for the longest-context table, GiB (default: %(default)g, an RTX PRO "
                             "6000 Blackwell)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=default.gpu_memory_utilization,
                        help="as vllm serve's flag (default: %(default)g, vLLM 0.23's)")
    parser.add_argument("--reserve", type=float, metavar="GIB", default=default.reserve_bytes / GIB,
                        help="GiB kept for activations, CUDA graphs and the CUDA context (default: %(default)g, "
                             "an assumption)")
    parser.add_argument("--max-num-seqs", type=int,
                        help="as vllm serve's flag (default: vllm serve's for the GPU size)")
    parser.add_argument("--max-num-batched-tokens", type=int,
                        help="as vllm serve's flag (default: vllm serve's for the GPU size)")
    return parser


def assumptions_from_args(args: argparse.Namespace) -> ServeAssumptions:
    default = ServeAssumptions()
    return ServeAssumptions(
        gpu_bytes=int(getattr(args, "gpu_memory", default.gpu_bytes / GIB) * GIB),
        gpu_memory_utilization=getattr(args, "gpu_memory_utilization", default.gpu_memory_utilization),
        reserve_bytes=int(getattr(args, "reserve", default.reserve_bytes / GIB) * GIB),
        max_num_seqs=getattr(args, "max_num_seqs", None),
        max_num_batched_tokens=getattr(args, "max_num_batched_tokens", None))


def run_inspect(args: argparse.Namespace) -> int:
    report = inspect_report(args.path, assumptions_from_args(args))
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 1 if any(f["level"] == "error" for f in report.get("findings", [])) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m glm5_shim.report",
                                     description="Summarise a GLM-5 (glm-dsa) GGUF.")
    add_inspect_arguments(parser)
    return run_inspect(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
