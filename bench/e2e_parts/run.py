"""`bench/e2e.py all`: write the models, start every arm's server, run each step on every arm, score against the
float32 reference in another process, stop the servers, write DIR/results.json and DIR/e2e.md."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .arms import MODEL_ARGS, all_arms
from .functional import bad_requests, functional, greedy, repeatability, same_answer
from .prompts import prompts
from .report import report
from .servers import alive, assign_ports, backends_from_log, start, stop, wait_ready
from .summary import summarize
from .throughput import _load, _throughput, ordinary_vocab

E2E_SCRIPT = Path(__file__).resolve().parents[1] / "e2e.py"  # the entry point; its `reference` step runs apart


def run_all(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    arms = [a for a in all_arms() if not args.arms or a.name in args.arms.split(",")]
    quants = sorted({a.quant for a in arms})
    results = {"date": time.strftime("%Y-%m-%d %H:%M"), "tp": args.tp, "command": " ".join(sys.argv),
               "gpu": gpu_name(), "arms": {a.name: {"quant": a.quant, "kv": a.kv, "path": a.path} for a in arms}}
    save = lambda: (out / "results.json").write_text(json.dumps(results, indent=1))
    from glm5_shim.gguf.fixture import PEAKED, make_tiny, reference_dir, write_dequantized_reference

    model_args = dict(MODEL_ARGS, heads=args.heads)
    if model_args["heads"] % args.tp:
        raise SystemExit(f"--heads {args.heads} is not divisible by --tp {args.tp}")
    if args.tp > 1:
        # every down projection must split into whole Q4_K blocks (256 values) on every rank (gguf/tp_split.py)
        model_args.update(intermediate=max(512, 256 * args.tp), moe_intermediate=256 * args.tp)
    extra = args.model_args
    per_quant = bool(extra) and set(extra) <= {"Q8_0", "Q4_K"}
    models = {}
    for q in quants:
        given = Path(args.models) / f"tiny-{q}.gguf" if args.models else None
        if given is not None and given.is_file():
            # a file written elsewhere (e.g. by llama.cpp's own tools: bench/real_gguf.py); the float32 reference is
            # what it stores
            path = given
            if not (reference_dir(path) / "model.safetensors").is_file():
                write_dequantized_reference(path, like=reference_dir(path))
        else:
            path = out / "models" / f"tiny-{q}.gguf"
            make_tiny(path, quant=q, reference="dequantized",
                      **{**model_args, **PEAKED, **(extra.get(q, {}) if per_quant else extra)})
        models[q] = str(path)
    results["models"] = {q: dict(path=p, **({"given": True} if args.models and Path(p).parent == Path(args.models)
                                            else {**model_args, **PEAKED, **(extra.get(q, {}) if per_quant
                                                                              else extra)}))
                         for q, p in models.items()}
    assign_ports(arms, args.base_port)
    for arm in arms:
        start(arm, models, out, args.tp, args.dtype)
    reference = None
    t_start = time.time()
    try:
        ready = []
        for arm in arms:
            try:
                wait_ready(arm, args.start_timeout)
                ready.append(arm)
                results["arms"][arm.name].update(startup_s=arm.startup_s, backends=backends_from_log(arm.log))
            except RuntimeError as exc:
                results["arms"][arm.name]["error"] = str(exc)[-1500:]
                print(f"[e2e] {exc}", flush=True)
        save()
        print(f"[e2e] ready: {[a.name for a in ready]}", flush=True)

        def on_every_arm(step, key, error_key):
            """Run step(arm) on every ready arm at once; a failure is recorded and the other arms go on."""
            def one(arm):
                try:
                    results["arms"][arm.name][key] = step(arm)
                except Exception as exc:  # noqa: BLE001
                    results["arms"][arm.name][error_key] = f"{key}: {exc!r}"[:1500]
            with ThreadPoolExecutor(len(ready) or 1) as pool:
                list(pool.map(one, ready))

        on_every_arm(functional, "functional", "error")
        on_every_arm(repeatability, "repeatability", "repeatability_error")
        save()
        print("[e2e] functional done", flush=True)

        primary = next((a for a in ready if a.path == "shim" and "functional" in results["arms"][a.name]), None)
        if primary is not None:
            ref = results["arms"][primary.name]["functional"]["greedy"]["sparse_600"]
            results["arms"][primary.name]["bad_requests"] = bad_requests(primary, ref)
            save()
        vocab = ordinary_vocab(ready[0]) if ready else []
        if not args.skip_throughput:
            # passes interleave the arms (shim, native, shim, native...) so that drift on the machine hits both
            tp_arms = [a for a in ready if not args.throughput_arms or a.name in args.throughput_arms.split(",")]
            rows = {a.name: [] for a in tp_arms}
            shapes = [(1, args.requests_c1, args.in_len, args.out_len),
                      (32, args.requests_c32, args.in_len, args.out_len)]
            # where the time goes at concurrency 32: prefill alone (1 output token), decode-heavy (short prompts)
            split = [(32, args.requests_c32, args.in_len, 1), (32, args.requests_c32, 64, 256)]
            for rep_i in [*range(1, args.throughput_passes + 1), "split"]:
                for arm in tp_arms:
                    if args.budget_s and time.time() - t_start + args.load_seconds + 90 > args.budget_s:
                        results["arms"][arm.name]["throughput_skipped"] = f"time budget (pass {rep_i})"
                        continue
                    for conc, n, in_len, out_len in (split if rep_i == "split" else shapes):
                        row = asyncio.run(_throughput(arm, conc, n, in_len, out_len, vocab))
                        row["pass"] = rep_i
                        rows[arm.name].append(row)
                        print(f"[e2e] throughput {arm.name} pass {rep_i} c={conc} {in_len}/{out_len}: {row}",
                              flush=True)
                    results["arms"][arm.name]["throughput"] = rows[arm.name]
                    save()
        # the float32 reference runs in another process during the load (the GPU has room for both; the load
        # checks correctness and loss, not speed)
        if not args.skip_reference:
            save()
            reference = subprocess.Popen([sys.executable, str(E2E_SCRIPT), "reference", str(out)],
                                         stdout=open(out / "reference.log", "w"), stderr=subprocess.STDOUT)
        if primary is not None and args.load_seconds > 0:
            results["arms"][primary.name]["load"] = asyncio.run(_load(primary, 32, args.load_seconds, vocab))
            before = results["arms"][primary.name]["functional"]["greedy"]
            after = {}
            for name in ("short", "sparse_600", "sparse_3000"):
                g = greedy(primary, prompts()[name])
                after[name] = same_answer(before[name], g["ids"], g["top"])
            results["arms"][primary.name]["after_load"] = after
            results["arms"][primary.name]["after_load_same_tokens"] = all(v["same"] for v in after.values())
            results["arms"][primary.name]["alive_after_load"] = alive(primary)
            print(f"[e2e] load: {results['arms'][primary.name]['load']}", flush=True)
            save()
    finally:
        for arm in arms:
            stop(arm)
    if reference is not None:
        reference.wait()
        ref_file = out / "reference.json"
        if ref_file.exists():
            results["reference"] = json.loads(ref_file.read_text())
        else:
            results["reference_error"] = (out / "reference.log").read_text(errors="replace")[-1500:]
    summarize(results)
    save()
    (out / "e2e.md").write_text(report(results))
    print(report(results), flush=True)
    return 0


def used_mib() -> int | None:
    """GPU memory in use (MiB, nvidia-smi), or None where it cannot be read."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout.split()
        return int(out[0])
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        return None


def gpu_name() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=20).stdout.strip().replace("\n", " + ")
    except (OSError, subprocess.SubprocessError):
        return "no GPU"
