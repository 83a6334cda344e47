"""Start-up memory of GLM-5.2-style GGUFs at long --max-model-len, through launch.sh (one server at a time).

    python bench/long_context.py --out DIR [--lens 131072,1048576] [--arms shim,native] [--kv auto]

Models (make-tiny, Q8_0, 7 layers, 16 heads, context_length 1048576):
  glm52     F F F S S S F: three layers share the previous full layer's top-k (no indexer weights, no indexer cache)
  all-full  the same with every layer running its own indexer (glm-dsa.attention.indexer.types all true)
Each (model, arm, length) starts `vllm serve` with --gpu-memory-utilization 0.9, waits until it answers /health,
keeps vLLM's own memory lines (weights, profile, KV cache size, CUDA graphs) and nvidia-smi's used memory, and stops
it.  DIR/long_context.md has the lines per run, DIR/results.json the parsed numbers.  What grows with the length is
the difference between two lengths of the same arm: vLLM's non-KV memory (indexer prefill workspace, block-table
buffers) — the KV pool takes the rest of the 90 %.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import e2e  # noqa: E402  (servers: start / wait_ready / stop)
from e2e_parts.run import used_mib  # noqa: E402
from e2e_parts.vllm_log import kept_lines, startup_numbers  # noqa: E402

MODELS = {"glm52": "glm52", "all-full": "FFFFFFF"}
MODEL_ARGS = dict(layers=7, heads=16, index_heads=32, index_topk=128, context_length=1 << 20, quant="Q8_0")


def run_one(model: str, arm_path: str, length: int, kv: str, out: Path, port: int, timeout: float) -> dict:
    arm = e2e.Arm(f"{Path(model).stem}-{arm_path}-{length}", "Q8_0", kv, arm_path, port=port)
    arm.model, arm.log = model, out / f"server_{arm.name}.log"
    cmd = ["bash", str(e2e.LAUNCH), model, "--port", str(port), "--max-model-len", str(length),
           "--kv-cache-dtype", kv, "--seed", "0", "--max-num-seqs", "64", "--gpu-memory-utilization", "0.9"]
    arm.startup_s = time.time()
    arm.proc = subprocess.Popen(cmd, stdout=open(arm.log, "w"), stderr=subprocess.STDOUT, env=arm.env(),
                                start_new_session=True, cwd=str(REPO))
    result = {"run": arm.name, "model": Path(model).stem, "arm": arm_path, "max_model_len": length, "kv": kv}
    try:
        e2e.wait_ready(arm, timeout)
        result.update(ok=True, startup_s=arm.startup_s, used_mib=used_mib())
    except RuntimeError as exc:
        result.update(ok=False, error=str(exc)[-1500:])
    finally:
        e2e.stop(arm)
    text = arm.log.read_text(errors="replace")
    result["lines"] = kept_lines(text)
    result.update(startup_numbers(text))
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--lens", default="131072,1048576")
    p.add_argument("--arms", default="shim,native")
    p.add_argument("--models", default="glm52,all-full")
    p.add_argument("--all-full-lens", default="131072", help="lengths for the all-full model (its KV per token)")
    p.add_argument("--kv", default="auto")
    p.add_argument("--start-timeout", type=float, default=300)
    p.add_argument("--budget-s", type=float, default=0, help="stop starting servers after this many seconds")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from glm5_shim.gguf.fixture import make_tiny

    t0 = time.time()
    runs = []
    for name in args.models.split(","):
        path = make_tiny(out / "models" / f"{name}.gguf", indexer_types=MODELS[name], write_reference=False,
                         **MODEL_ARGS)[0]
        lens = args.lens if name == "glm52" else args.all_full_lens
        for arm_path in args.arms.split(","):
            for length in (int(x) for x in lens.split(",")):
                if args.budget_s and time.time() - t0 > args.budget_s:
                    runs.append({"run": f"{name}-{arm_path}-{length}", "ok": False, "error": "time budget"})
                    continue
                r = run_one(str(path), arm_path, length, args.kv, out, 8300 + len(runs), args.start_timeout)
                print("[long_context]", json.dumps({k: v for k, v in r.items() if k != "lines"}), flush=True)
                runs.append(r)
                (out / "results.json").write_text(json.dumps(runs, indent=1))
    md = [f"# Long-context start-up memory — {time.strftime('%Y-%m-%d %H:%M')} — {e2e.gpu_name()}", "",
          f"Command: `{' '.join(sys.argv)}`", "",
          "| run | ok | start-up s | weights GiB | KV pool GiB | KV tokens | KV B/token | CUDA graphs GiB "
          "| GPU used MiB |",
          "|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        md.append(f"| {r['run']} | {r.get('ok')} | {r.get('startup_s', '-')} | {r.get('weights_gib', '-')} | "
                  f"{r.get('available_kv_gib', '-')} | {r.get('kv_tokens', '-')} | "
                  f"{r.get('kv_bytes_per_token', '-')} | "
                  f"{r.get('graphs_gib', '-')} | {r.get('used_mib', '-')} |")
    for r in runs:
        md += ["", f"## {r['run']}", ""] + [f"    {line}" for line in r.get("lines", [])]
        if not r.get("ok"):
            md += ["", "    " + r.get("error", "")[-800:].replace("\n", "\n    ")]
    (out / "long_context.md").write_text("\n".join(md) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
