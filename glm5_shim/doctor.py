"""``python -m glm5_shim doctor``: what is patched and what will be used, before any GPU memory is taken.

GPU facts come from NVML (no CUDA context is created); the backend choice is computed from vLLM's own validation
rules, not by building a model.
"""
from __future__ import annotations

import json
import platform
from importlib import metadata

from glm5_shim import __version__, settings

PACKAGES = ("vllm", "torch", "triton", "transformers", "gguf", "wrapt")
TARGET_CAPABILITIES = ((12, 0), (12, 1), (10, 0), (9, 0), (8, 9), (8, 6), (8, 0))


def _version(pkg: str) -> str | None:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def gpus() -> tuple[list[dict], str]:
    """Visible GPUs through NVML, or ([], why not)."""
    try:
        from vllm.third_party import pynvml
    except Exception:
        try:
            import pynvml  # type: ignore
        except Exception as exc:
            return [], f"NVML bindings unavailable ({exc})"
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        return [], f"no GPU (NVML: {exc})"
    try:
        found = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            found.append({"index": i, "name": name.decode() if isinstance(name, bytes) else name,
                          "capability": [major, minor], "memory_gib": round(mem.total / 2**30, 1),
                          "memory_bytes": int(mem.total)})
        return found, "" if found else "no GPU (NVML sees none)"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _patch_status() -> tuple[str, list[dict]]:
    from glm5_shim import activation
    from glm5_shim.patches import load_all
    from glm5_shim.registry import REGISTRY, WAITING

    activation.activate("doctor")
    state = activation.state()
    load_all(REGISTRY)
    if state in ("active", "waiting-for-vllm"):
        import importlib

        for patch in REGISTRY.patches():  # importing a target fires its hook: the status becomes real
            try:
                importlib.import_module(patch.target)
            except Exception as exc:  # e.g. vllm.platforms.cuda needs the CUDA driver: not on a CPU machine
                if patch.state == WAITING:
                    patch.reason = f"{patch.target} cannot be imported here ({type(exc).__name__}: {exc})"
    rows = REGISTRY.status()
    if state == "disabled":
        for row in rows:
            row["state"], row["reason"] = "disabled", "GLM5_SHIM=0"
    return state, rows


def _plan_for(capability: tuple[int, int], gguf: bool = True, shim_runs_every_matmul: bool = False) -> dict:
    import torch

    from glm5_shim.attention.selection import deepgemm_can_run, native_sparse_mla

    from glm5_shim.loading.gguf_dtype import gguf_dtype_for_auto

    dtype = getattr(torch, gguf_dtype_for_auto(capability, shim_runs_every_matmul)) if gguf else torch.bfloat16
    choice = native_sparse_mla(capability, dtype)
    attention = {"dtype": str(dtype).replace("torch.", ""), "native": choice.name, "rejected": choice.rejected}
    if settings.attention_choice() == "triton":
        attention["uses"] = "glm5-shim Triton sparse MLA (CUSTOM), forced by GLM5_SHIM_ATTENTION=triton"
    elif choice.name is None:
        attention["uses"] = "glm5-shim Triton sparse MLA (CUSTOM): no native sparse-MLA backend is valid"
    else:
        attention["uses"] = f"{choice.name} (native)"
    ok, why = deepgemm_can_run(capability)
    indexer = {"deepgemm": ok, "why": why}
    if settings.indexer_choice() == "triton":
        indexer["uses"] = "glm5-shim Triton indexer, forced by GLM5_SHIM_INDEXER=triton"
    elif ok:
        indexer["uses"] = "DeepGEMM (native)"
    else:
        indexer["uses"] = "glm5-shim Triton indexer: DeepGEMM cannot run here"
    return {"capability": f"{capability[0]}.{capability[1]}", "attention": attention, "indexer": indexer}


def collect(model: str | None = None) -> dict:
    versions = {"python": platform.python_version(), **{p: _version(p) for p in PACKAGES}}
    from glm5_shim.activation import vllm_version_supported

    report: dict = {"glm5_shim": __version__, "versions": versions,
                    "vllm_supported": vllm_version_supported(versions["vllm"]),
                    "env": {k: __import__("os").environ.get(k) for k in settings.ENV_SWITCHES}}
    state, rows = _patch_status()
    from glm5_shim import activation

    report["activation"] = activation.state()
    report["activated_by"] = activation.activated_by()
    report["patches"] = rows
    found, why = gpus()
    report["gpus"] = found
    report["gpu_note"] = why
    caps = sorted({tuple(g["capability"]) for g in found}) or []
    covered = False
    if model:  # the file decides the dtype on capability >= 10 (loading/gguf_dtype.py)
        from glm5_shim.kernels.gguf.routing import every_matmul_on_shim_kernels

        covered = every_matmul_on_shim_kernels(model)
    report["plan"] = [_plan_for(c, shim_runs_every_matmul=covered) for c in caps] if caps else []
    if not caps:
        report["plan_if"] = [_plan_for(c, shim_runs_every_matmul=covered) for c in TARGET_CAPABILITIES]
    if model:
        # the longest-context table for the smallest GPU here, or for a 96 GB RTX PRO 6000 without one
        smallest = min((g["memory_bytes"] for g in found if g.get("memory_bytes")), default=None)
        report["model"] = _model_summary(model, smallest)
    return report


def _model_summary(path: str, gpu_bytes: int | None = None) -> dict:
    """Header-only check of the model: what the loader would say, before any GPU memory is taken."""
    from glm5_shim.gguf.probe import gguf_architecture
    from glm5_shim.report import OTHER_MODEL_NOTE, is_other_architecture
    from glm5_shim.gguf.validate import validate

    summary: dict = {"path": path, "architecture": gguf_architecture(path)}
    if is_other_architecture(summary["architecture"]):  # another model: vLLM serves it, nothing for the shim to check
        return dict(summary, errors=[], warnings=[], other_model=OTHER_MODEL_NOTE)
    findings = validate(path)
    summary["errors"] = [f.message for f in findings if f.level == "error"]
    summary["warnings"] = [f.message for f in findings if f.level != "error"]
    if not summary["errors"]:
        from glm5_shim.report import inspect_report
        from glm5_shim.gguf.memory import ServeAssumptions

        report = inspect_report(path, ServeAssumptions(gpu_bytes=gpu_bytes) if gpu_bytes else ServeAssumptions())
        summary["weight_bytes_per_gpu"] = report["weight_bytes_per_gpu"]
        summary["indexer_layout"] = report["indexer_layout"]
        summary["kv_cache_bytes_per_token"] = report["kv_cache_bytes_per_token"]
        summary["longest_context"] = report["longest_context"]
        summary["matmul_paths"] = report.get("matmul_paths")
        summary["mtp"] = report.get("mtp")
        if "tp_split" in report:
            summary["tp_split"] = report["tp_split"]
    return summary


def format_text(r: dict) -> str:
    lines = [f"glm5-shim {r['glm5_shim']} doctor"]
    v = r["versions"]
    lines.append("versions: " + ", ".join(f"{k} {v[k] or 'not installed'}" for k in v))
    if not r["vllm_supported"]:
        lines.append(f"  !! vLLM {v['vllm']} is not {settings.SUPPORTED_VLLM}.x: the shim patches nothing "
                     "(GLM5_SHIM_FORCE=1 to try anyway)")
    lines.append(f"activation: {r['activation']} (via {', '.join(dict.fromkeys(r['activated_by']))})")
    set_env = {k: val for k, val in r["env"].items() if val is not None}
    lines.append("env: " + (", ".join(f"{k}={val}" for k, val in set_env.items()) or "(no GLM5_SHIM_* set)"))
    if r["gpus"]:
        for g in r["gpus"]:
            lines.append(f"GPU {g['index']}: {g['name']}, compute capability {g['capability'][0]}."
                         f"{g['capability'][1]}, {g['memory_gib']} GiB")
    else:
        lines.append(f"GPU: {r['gpu_note']}")
    lines.append("patches:")
    width = max((len(p["name"]) for p in r["patches"]), default=10)
    for p in r["patches"]:
        extra = f" ({p['reason']})" if p["reason"] else ""
        lines.append(f"  {p['name']:<{width}}  {p['state']}{extra}")
        lines.append(f"  {'':<{width}}  {p['summary']}")
    plans = r["plan"] or r.get("plan_if", [])
    if not r["plan"]:
        lines.append("what GLM-5 would use (no GPU here; per compute capability):")
    else:
        lines.append("what GLM-5 will use on this machine:")
    for plan in plans:
        a, i = plan["attention"], plan["indexer"]
        lines.append(f"  {plan['capability']:>4}: dtype {a['dtype']}; attention: {a['uses']}; indexer: {i['uses']}")
        if a["native"] is None:
            for name, reasons in a["rejected"].items():
                lines.append(f"        {name} rejected: {', '.join(reasons)}")
        if not i["deepgemm"]:
            lines.append(f"        DeepGEMM: {i['why']}")
    if "model" in r:
        m = r["model"]
        if m.get("other_model"):
            lines.append(f"model: {m['path']} (architecture {m['architecture']}): {m['other_model']}")
            return "\n".join(lines)
        verdict = "OK" if not m["errors"] else f"{len(m['errors'])} error(s)"
        lines.append(f"model: {m['path']} (architecture {m['architecture']}): {verdict}, "
                     f"{len(m['warnings'])} warning(s)")
        for message in m["errors"][:10] + m["warnings"][:10]:
            lines.append(f"  {message}")
        if "weight_bytes_per_gpu" in m:
            gib = {tp: b / 2**30 for tp, b in m["weight_bytes_per_gpu"].items()}
            kv = m["kv_cache_bytes_per_token"]
            lines.append("  weights per GPU: " + ", ".join(f"TP{tp} {v:.2f} GiB" for tp, v in gib.items()))
            lines.append(f"  DSA indexer: {m['indexer_layout']['description']}")
            lines.append(f"  KV cache per token: {kv['total_bf16']} B bf16, {kv['total_fp8_ds_mla']} B with "
                         f"--kv-cache-dtype fp8_ds_mla (MLA in {kv['layers']} layers + indexer in "
                         f"{kv['indexer_layers']})")
            from glm5_shim.gguf.memory import format_context_table

            first, *rows = format_context_table(m["longest_context"], indent="    ")
            lines.append("  " + first)
            lines.extend(rows)
        if m.get("matmul_paths"):
            from glm5_shim.report import format_matmul_paths

            lines.append("  " + format_matmul_paths(m["matmul_paths"]))
        if m.get("mtp"):
            from glm5_shim.report import format_mtp

            lines.append("  " + format_mtp(m["mtp"]))
        split = m.get("tp_split", {})
        if "clean" in split:
            bad = [tp for tp in (1, 2, 4, 8) if tp not in split["clean"]]
            ep = [tp for tp in bad if tp in split["clean_with_expert_parallel"]]
            lines.append("  tensor parallel: " + ", ".join(f"TP{tp}" for tp in split["clean"])
                         + (" split cleanly" if split["clean"] else "none splits cleanly")
                         + (f"; TP{', TP'.join(map(str, bad))} would cut quantized blocks (refused at start-up)"
                            if bad else "")
                         + (f"; TP{', TP'.join(map(str, ep))} work with --enable-expert-parallel" if ep else ""))
    return "\n".join(lines)


def main(args) -> int:
    import os

    # vLLM logs to stdout; doctor's own output (and --json) must stay clean.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    report = collect(args.model)
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        print(format_text(report))
    return 0
