"""MTP speculative decoding end to end on a GPU (issue #17): a tiny GLM-5 GGUF served with its own MTP layer as the
draft (`--speculative-config '{"method": "mtp", "num_speculative_tokens": K}'`), through launch.sh.

    python bench/mtp.py run --out DIR [--k 1,2] [--paths shim,native] [--dtype float16] [--quant Q8_0] [--tp 1]
                                      [--throughput 1,4,32] [--slice Q4_K_M]
    python bench/mtp.py report DIR       rewrite DIR/mtp.md from DIR/mtp.json

Models (make-tiny, the e2e shape, reference = what the GGUF stores):
    peaked-mtp   --peaked-mtp: the MTP layer drafts the peaked model's next token (the float32 reference accepts
                 every draft: glm5_shim.gguf.fixture.weights._mtp_follows_bigram)
    peaked       --peaked: the same trunk with a random MTP layer (the reference accepts almost none): the control
                 that shows acceptance is measured, not assumed
An arm is a path (shim: GLM5_SHIM_ATTENTION=triton GLM5_SHIM_INDEXER=triton, the code SM120 runs; native: vLLM's
own choice) x K: peaked-mtp at K=0 (no --speculative-config) and every --k, peaked at K=1.  Every arm: greedy
completions (token ids) of the prompts, and vLLM's spec-decode counters from /metrics (drafts, draft tokens,
accepted tokens, accepted per position).  All servers run at once, each with a 1 GiB KV pool.
DIR/mtp.md, one line per check:
  * an MTP arm's greedy tokens equal those of peaked-mtp at K=0 on its path (the two models share the trunk;
    speculative decoding must not change greedy output; a first difference at a near-tie of the K=0 arm's top two
    counts as equal, as in bench/e2e.py);
  * acceptance = accepted / draft tokens; for K=1 against the float32 reference's on the arm's own tokens
    (draft_acceptance): peaked-mtp near 1, peaked near 0;
  * the seconds per output token with and without the draft (a tiny model: overhead-bound, for information);
  * output tokens/s at each --throughput concurrency, and the ratio to K=0 on the same path;
  * with --profile C: each arm's kernels in a torch-profiler window of decode at concurrency C, grouped as in
    bench/slice_serve.py, a target step (drafting included) against K=0's: what a speculative step costs, by group,
    and the speed-up that cost allows at the measured acceptance ((1 + accepted a step) / cost).
--slice PRESET serves a rank-of-8 slice of GLM-5 at its real sizes with its MTP layer (make-slice --mtp; 4 layers,
or --slice-layers N) instead, at K=0 and every K: random weights accept almost no draft, so it measures what a
speculative step costs where a step is GPU time (speed-up ~ (1 + accepted per step) / that cost) and greedy equality
at real sizes.  --slice-peaked writes make-slice --peaked instead, whose MTP layer drafts the slice's own greedy
tokens (acceptance near 1): the speed-up itself, on a model as deep as --slice-layers (78: one TP-8 rank of GLM-5).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

_BENCH = Path(__file__).resolve().parent
if str(_BENCH.parent) not in sys.path:
    sys.path.insert(0, str(_BENCH.parent))
if str(_BENCH) not in sys.path:
    sys.path.append(str(_BENCH))

from e2e_parts.arms import MODEL_ARGS, Arm  # noqa: E402
from e2e_parts.functional import NEAR_TIE, common_prefix, top2_gap  # noqa: E402
from e2e_parts.prompts import words  # noqa: E402

SPEC_COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens")
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"
GEN_TOKENS = 64


def prompts() -> dict[str, str]:
    """Below index_topk (128) and above it; short enough for the NumPy reference."""
    return {"short": "Hello, my name is", "below_topk": words(40, 1), "sparse_300": words(230, 2)}


def speculative_config(k: int) -> str:
    return json.dumps({"method": "mtp", "num_speculative_tokens": k})


def parse_spec_metrics(text: str) -> dict:
    """vLLM's spec-decode counters from a /metrics page (Prometheus text): {"drafts", "draft_tokens", "accepted",
    "per_position": {position: accepted}}, summed over engines."""
    out = {"drafts": 0.0, "draft_tokens": 0.0, "accepted": 0.0, "per_position": {}}
    keys = dict(zip(SPEC_COUNTERS, ("drafts", "draft_tokens", "accepted")))
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        match = re.match(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)", line)
        if not match:
            continue
        name, labels, value = match.group(1), match.group(2) or "", float(match.group(3))
        name = name.removesuffix("_total")
        if name in keys:
            out[keys[name]] += value
        elif name == PER_POSITION:
            pos = re.search(r'position="(\d+)"', labels)
            if pos:
                out["per_position"][int(pos.group(1))] = out["per_position"].get(int(pos.group(1)), 0.0) + value
    return out


def metrics_delta(before: dict, after: dict) -> dict:
    delta = {k: after[k] - before[k] for k in ("drafts", "draft_tokens", "accepted")}
    delta["per_position"] = {p: v - before["per_position"].get(p, 0.0) for p, v in after["per_position"].items()}
    delta["acceptance"] = delta["accepted"] / delta["draft_tokens"] if delta["draft_tokens"] else None
    return delta


def same_greedy(spec: dict, plain: dict) -> bool:
    """Equal tokens, or a first difference where the plain arm's top two were within NEAR_TIE."""
    n = common_prefix(spec["ids"], plain["ids"])
    return n == len(plain["ids"]) or (n < len(plain["top"]) and top2_gap(plain["top"][n]) < NEAR_TIE)


# nats: a prompt token's log-prob with a draft against without one.  The same batch shapes give the same prompt
# pass (bf16 arithmetic of the verify steps does not enter it); the run of 2026-12-04 saw 0.000 where right and up
# to 11 nats (or NaN) where vLLM 0.23 read the prompt's hidden states after the drafter's graphs had replayed over
# them (patches/mtp_prompt_logprobs.py)
PROMPT_LOGPROB_TOLERANCE = 0.1


def prompt_logprob_gap(spec: dict, plain: dict) -> float | None:
    """The largest |difference| of the prompt tokens' log-probs between two greedy results (NaN counts as
    infinite); None where either has none."""
    a, b = spec.get("prompt_logprobs"), plain.get("prompt_logprobs")
    if not a or not b or len(a) != len(b):
        return None
    gaps = [abs(x - y) if x == x and y == y else float("inf") for x, y in zip(a, b) if x is not None and y is not None]
    return max(gaps, default=0.0)


def arm_name(model: str, path: str, k: int) -> str:
    return f"{model}-{path}-k{k}"


SLICE_MODEL = "slice-mtp"  # --slice: GLM-5's real sizes (make-slice --rank-of 8 --mtp), random weights
SLICE_PEAKED_MODEL = "slice-peaked-mtp"  # --slice with --slice-peaked: make-slice --peaked, its MTP drafts its tokens
DRAFTING_MODELS = ("peaked-mtp", SLICE_PEAKED_MODEL)  # whose MTP layer should be accepted (the rest: almost never)


def all_arms(paths: list[str], ks: list[int], slice_preset: str = "", kv: str = "auto",
             slice_peaked: bool = False) -> list[Arm]:
    """Per path: the peaked-mtp model at K=0 and every K, the random-MTP control at K=1; with a slice preset the
    slice at K=0 and every K instead (its random MTP layer accepts almost nothing: what it measures is the cost of
    a speculative step where the step is GPU time, and greedy equality at real sizes)."""
    slice_model = SLICE_PEAKED_MODEL if slice_peaked else SLICE_MODEL
    models = ((slice_model, [0] + ks),) if slice_preset else (("peaked-mtp", [0] + ks), ("peaked", [1]))
    arms = []
    for path in paths:
        for model, model_ks in models:
            for k in model_ks:
                arm = Arm(arm_name(model, path, k), model, kv, path)  # Arm.quant names the model here
                arm.k = k
                arms.append(arm)
    return arms


def summarize(results: dict) -> list[tuple[str, bool | None, str]]:
    """(check, passed or None for information, detail) per line of DIR/mtp.md."""
    lines = []
    arms = results["arms"]
    for name, arm in sorted(arms.items()):
        if arm.get("error"):
            lines.append((f"{name} served", False, arm["error"][:300]))
            continue
        if arm["k"] == 0:
            continue
        plain = arms.get(arm_name("peaked-mtp" if arm["model"] == "peaked" else arm["model"], arm["path"], 0),
                         {})  # the same trunk
        if "greedy" in plain:
            same = all(same_greedy(arm["greedy"][p], plain["greedy"][p]) for p in arm["greedy"])
            lines.append((f"{name}: greedy tokens equal the K=0 server's", same, ""))
            gaps = [g for g in (prompt_logprob_gap(arm["greedy"][p], plain["greedy"][p]) for p in arm["greedy"]
                                if p in plain["greedy"]) if g is not None]
            if gaps:
                lines.append((f"{name}: prompt log-probs equal the K=0 server's", max(gaps) <= PROMPT_LOGPROB_TOLERANCE,
                              f"largest difference {max(gaps):.3f} nats"))
            per_token = arm["seconds_per_token"] / plain["seconds_per_token"] if plain.get("seconds_per_token") else 0
            lines.append((f"{name}: seconds per output token vs K=0", None, f"x{per_token:.2f}"))
        m = arm["metrics"]
        detail = (f"acceptance {m['acceptance']:.3f} ({m['accepted']:.0f}/{m['draft_tokens']:.0f}; per position "
                  + ", ".join(f"{p}: {v / m['drafts']:.3f}" for p, v in sorted(m["per_position"].items()))
                  + ")") if m["acceptance"] is not None and m["drafts"] else "no drafts counted"
        if arm["k"] == 1 and "reference_acceptance" in arm:
            ref = arm["reference_acceptance"]
            detail += f"; float32 reference on these tokens {ref:.3f}"
            ok = m["acceptance"] is not None and (abs(m["acceptance"] - ref) <= 0.1 if arm["model"] in DRAFTING_MODELS
                                                  else m["acceptance"] <= ref + 0.1)
            lines.append((f"{name}: acceptance as the reference's", ok, detail))
        else:
            drafting = arm["model"] in DRAFTING_MODELS
            expected = m["acceptance"] is not None and (m["acceptance"] >= 0.8 if drafting else m["acceptance"] <= 0.2)
            lines.append((f"{name}: acceptance {'high' if drafting else 'low'}", expected, detail))
    return lines


def report(results: dict) -> str:
    rows = [f"# MTP speculative decoding ({results.get('date', '')}, {results.get('gpu', '')})", "",
            f"command: `{results.get('command', '')}`; model {results.get('quant', '?')}, KV cache "
            f"{results.get('kv_cache_dtype', 'auto')}", "", "| check | result | detail |", "|---|---|---|"]
    for check, ok, detail in summarize(results):
        rows.append(f"| {check} | {'-' if ok is None else 'PASS' if ok else 'FAIL'} | {detail} |")
    rows += throughput_lines(results)
    rows += profile_lines(results)
    return "\n".join(rows) + "\n"


def step_cost(results: dict, name: str, concurrency: str) -> dict | None:
    """A speculative arm's profiled step against its K=0 arm's at one concurrency: kernel µs a step by group (each
    target step with its drafting), the cost ratio, accepted tokens a step, and the speed-up they allow."""
    arms = results["arms"]
    arm = arms[name]
    base = arms.get(arm_name(arm["model"], arm["path"], 0), {})
    mine, theirs = (a.get("profile", {}).get(concurrency, {}).get("per_step_us") for a in (arm, base))
    if not mine or not theirs:
        return None
    cost = sum(mine.values()) / sum(theirs.values())
    m = arm.get("throughput", {}).get(concurrency, {}).get("metrics", {})
    accepted = m["accepted"] / m["drafts"] if m.get("drafts") else None
    # wall time a step inside the profiled window (first kernel to last over the steps): against the kernel time it
    # shows how much of a step the GPU waits for the host (the profiler slows the host too, so both arms are
    # compared under it)
    spans = [_step_span_us(a.get("profile", {}).get(concurrency, {})) for a in (base, arm)]
    return {"by_group": {g: (theirs.get(g, 0.0), mine.get(g, 0.0)) for g in mine}, "cost": cost,
            "accepted_per_step": accepted, "allowed": (1 + accepted) / cost if accepted is not None else None,
            "span_us": spans if None not in spans else None,
            "kernel_us": (sum(theirs.values()), sum(mine.values()))}


def _step_span_us(profile: dict) -> float | None:
    steps, span = profile.get("steps"), profile.get("gpu_span_us")
    return span / steps if steps and span else None


def profile_lines(results: dict) -> list[str]:
    """Markdown: per speculative arm and profiled concurrency, kernel µs a step by group, K=0 → K."""
    rows = []
    for name, arm in sorted(results["arms"].items()):
        for c in sorted(arm.get("profile", {}), key=int):
            if arm["k"] == 0:
                continue
            sc = step_cost(results, name, c)
            if sc is None:
                err = arm["profile"][c].get("error") or "no K=0 profile to compare"
                rows += ["", f"{name}, concurrency {c}: no step cost ({err})"]
                continue
            allowed = (f"; accepted {sc['accepted_per_step']:.2f} a step: speed-up at most x{sc['allowed']:.2f} "
                       "from kernel time") if sc["allowed"] is not None else ""
            rows += ["", f"{name}, concurrency {c}: kernel µs a step, K=0 → K={arm['k']} (cost x{sc['cost']:.2f}"
                     f"{allowed})", "", "| group | K=0 | K | x |", "|---|---|---|---|"]
            rows += [f"| {g} | {a:.1f} | {b:.1f} | {'x%.2f' % (b / a) if a else '-'} |"
                     for g, (a, b) in sc["by_group"].items()]
            if sc["span_us"]:
                (a, b), (ka, kb) = sc["span_us"], sc["kernel_us"]
                rows += [f"| **step wall µs** (profiled window ÷ steps) | {a:.1f} | {b:.1f} | x{b / a:.2f} |",
                         f"| GPU busy (kernels ÷ wall) | {100 * ka / a:.0f} % | {100 * kb / b:.0f} % | |"]
            rows += host_lines(results, name, c)
    return rows


def host_lines(results: dict, name: str, concurrency: str) -> list[str]:
    """Markdown: the host side of a step of arm `name` against its K=0 arm's, from the same profiles (slice_parts'
    group_trace): the step annotations' time and the CUDA calls a step (µs, calls) by name, the union of both
    arms' most costly calls.  Eager kernel launches (cudaLaunchKernel) and waits for the GPU (*Synchronize) are
    what a draft step adds on the host."""
    arm = results["arms"][name]
    base = results["arms"].get(arm_name(arm["model"], arm["path"], 0), {})
    mine, theirs = (a.get("profile", {}).get(concurrency, {}) for a in (arm, base))
    if not mine.get("runtime_per_step") or not theirs.get("runtime_per_step"):
        return []
    rows = ["", f"{name}, concurrency {concurrency}: host side a step (µs, calls), K=0 → K={arm['k']}", "",
            "| | K=0 | K |", "|---|---|---|"]
    if mine.get("host_step_us") is not None and theirs.get("host_step_us") is not None:
        rows.append(f"| step annotation µs | {theirs['host_step_us']:.1f} | {mine['host_step_us']:.1f} |")
    calls = list(dict.fromkeys([*theirs["runtime_per_step"], *mine["runtime_per_step"]]))
    cell = lambda v: f"{v[0]:.1f} ({v[1]:g})" if v else "-"  # noqa: E731
    rows += [f"| {call} | {cell(theirs['runtime_per_step'].get(call))} | {cell(mine['runtime_per_step'].get(call))} |"
             for call in calls]
    return rows


def _greedy(arm: Arm, prompt: str) -> dict:
    from e2e_parts.functional import greedy

    return greedy(arm, prompt, max_tokens=GEN_TOKENS)


THROUGHPUT_IN, THROUGHPUT_OUT = 64, 128  # tokens in / out per request (random plain-word prompts, EOS ignored)


def _throughput_table(arm: Arm, concurrencies: list[int]) -> dict:
    """Output tokens/s of ``arm`` at each concurrency (bench/e2e_parts/throughput's streamed requests; 4 requests
    a client), with its spec-decode counters over the same requests."""
    import asyncio

    from e2e_parts.throughput import _throughput, ordinary_vocab

    vocab = ordinary_vocab(arm)
    table = {}
    for c in concurrencies:
        before = parse_spec_metrics(_metrics(arm))
        row = asyncio.run(_throughput(arm, c, max(8, 4 * c), THROUGHPUT_IN, THROUGHPUT_OUT, vocab))
        row["metrics"] = metrics_delta(before, parse_spec_metrics(_metrics(arm)))
        table[str(c)] = row
    return table


def throughput_lines(results: dict) -> list[str]:
    """Markdown table: output tokens/s of the peaked-mtp arms at each concurrency, and the ratio to K=0."""
    arms = {n: a for n, a in results["arms"].items() if a.get("throughput")}
    if not arms:
        return []
    concs = sorted({int(c) for a in arms.values() for c in a["throughput"]})
    rows = ["", f"Output tokens/s (requests of {THROUGHPUT_IN} tokens in, {THROUGHPUT_OUT} out; x = vs K=0 on the "
            "same path; acceptance over the same requests)", "",
            "| arm | " + " | ".join(f"conc {c}" for c in concs) + " |", "|---|" + "---|" * len(concs)]
    for name, arm in sorted(arms.items()):
        base = results["arms"].get(arm_name(arm["model"], arm["path"], 0), {}).get("throughput", {})
        cells = []
        for c in concs:
            r = arm["throughput"].get(str(c), {})
            tps = r.get("output_tok_s")
            b = base.get(str(c), {}).get("output_tok_s")
            m = r.get("metrics", {})
            acc = f", acc {m['acceptance']:.2f}" if m.get("acceptance") is not None and arm["k"] else ""
            ratio = f" (x{tps / b:.2f}{acc})" if tps and b and arm["k"] else ""
            cells.append(f"{tps}{ratio}" + (f", {r['errors']} errors" if r.get("errors") else ""))
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return rows


def run(args) -> int:
    from e2e_parts.run import gpu_name
    from e2e_parts.servers import assign_ports, start, stop, wait_ready
    from slice_parts.parts import profiler_flags
    from glm5_shim.gguf.fixture import PEAKED, PEAKED_MTP, draft_acceptance, make_tiny, reference_dir

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ks = [int(k) for k in args.k.split(",")]
    arms = all_arms(args.paths.split(","), ks, args.slice, args.kv, args.slice_peaked)
    results = {"date": time.strftime("%Y-%m-%d %H:%M"), "gpu": gpu_name(), "command": " ".join(sys.argv),
               "tp": args.tp, "dtype": args.dtype or "auto", "kv_cache_dtype": args.kv,
               "quant": f"slice {args.slice}" if args.slice else args.quant,
               "arms": {}}
    model_args = dict(MODEL_ARGS)
    if args.tp > 1:  # every down projection must split into whole Q4_K blocks on every rank (as bench/e2e.py)
        model_args.update(intermediate=max(512, 256 * args.tp), moe_intermediate=256 * args.tp)
    models = {}
    if args.slice:
        from glm5_shim.gguf.slice import make_slice

        # GLM-5: 3 dense layers, then MoE; up to 4 layers 1 dense (the 4-layer slice of earlier runs: 1 + 3 MoE)
        layers = args.slice_layers
        dense = 1 if layers <= 4 else 3
        tag = f"slice-r8-{args.slice}-{layers}L{'-peaked' if args.slice_peaked else ''}-mtp"
        path = out / "models" / f"{tag}.gguf"
        path.parent.mkdir(parents=True, exist_ok=True)
        made = make_slice(path, layers=layers, dense_layers=dense, preset=args.slice, mtp=True, rank_of=8,
                          peaked=args.slice_peaked)
        results["slice"] = {"preset": args.slice, "layers": layers, "dense_layers": dense, "rank_of": 8,
                            "peaked": args.slice_peaked, "gb": round(made.nbytes / 1e9, 2),
                            "seconds": round(made.seconds, 1)}
        models[SLICE_PEAKED_MODEL if args.slice_peaked else SLICE_MODEL] = str(path)
    for model, extra in () if args.slice else (("peaked-mtp", PEAKED_MTP), ("peaked", PEAKED)):
        path = out / "models" / f"tiny-{model}-{args.quant}.gguf"
        make_tiny(path, quant=args.quant, reference="dequantized", **{**model_args, **extra})
        models[model] = str(path)
    results["models"] = models
    save = lambda: (out / "mtp.json").write_text(json.dumps(results, indent=1))  # noqa: E731
    assign_ports(arms, args.base_port)
    for arm in arms:
        extra = ("--speculative-config", speculative_config(arm.k)) if arm.k else ()
        if args.profile:
            extra += profiler_flags(trace_dir(out, arm))
        start(arm, models, out, args.tp, args.dtype, extra)
    try:
        # Every server is up before any is timed: a server still compiling or capturing graphs takes the host's
        # cores, and a timed arm's steps are host-bound at low concurrency (2026-12-04 measured K=0's first-token
        # time doubled and K=3's steps 1.5x longer while the other arms started).
        not_ready = {}
        for arm in arms:
            try:
                wait_ready(arm, args.start_timeout)
            except Exception as exc:  # noqa: BLE001 - the other arms still run
                not_ready[arm.name] = f"{type(exc).__name__}: {exc}"
        for arm in arms:
            entry = results["arms"][arm.name] = {"model": arm.quant, "path": arm.path, "k": arm.k}
            try:
                if arm.name in not_ready:
                    raise RuntimeError(not_ready[arm.name])
                before = parse_spec_metrics(_metrics(arm))
                t0 = time.time()
                entry["greedy"] = {name: _greedy(arm, text) for name, text in prompts().items()}
                n_tokens = sum(len(g["ids"]) for g in entry["greedy"].values())
                entry["seconds_per_token"] = (time.time() - t0) / max(n_tokens, 1)
                entry["metrics"] = metrics_delta(before, parse_spec_metrics(_metrics(arm)))
                if arm.quant in ("peaked-mtp", SLICE_MODEL, SLICE_PEAKED_MODEL) and args.throughput:
                    entry["throughput"] = _throughput_table(arm, [int(c) for c in args.throughput.split(",")])
                if arm.quant in ("peaked-mtp", SLICE_MODEL, SLICE_PEAKED_MODEL) and args.profile:
                    entry["profile"] = _profile(arm, out, [int(c) for c in args.profile.split(",")], entry)
            except Exception as exc:  # noqa: BLE001 - one broken arm must not hide the others
                entry["error"] = f"{type(exc).__name__}: {exc}"
            save()
    finally:
        for arm in arms:
            stop(arm)
    for name, entry in results["arms"].items():
        if entry.get("k") == 1 and "greedy" in entry and not entry["model"].startswith("slice"):  # no reference
            ref_dir = reference_dir(models[entry["model"]])
            accepted = [a for g in entry["greedy"].values()
                        for a in draft_acceptance(ref_dir, g["prompt_ids"] + g["ids"], len(g["prompt_ids"]))]
            entry["reference_acceptance"] = sum(accepted) / len(accepted) if accepted else None
    save()
    text = report(results)
    (out / "mtp.md").write_text(text)
    print(text)
    return 0 if all(ok is not False for _, ok, _ in summarize(results)) else 1


PROFILE_MAX_TOKENS = 2048  # the profiled streams' length: they are cancelled when the window closes


def trace_dir(out: Path, arm: Arm) -> Path:
    path = out / "traces" / arm.name
    path.mkdir(parents=True, exist_ok=True)
    return path


def _profile(arm: Arm, out: Path, concurrencies: list[int], entry: dict) -> dict:
    """Kernel time a step of `arm` in a decode window at each concurrency (slice_parts.measure.profile_decode)."""
    from e2e_parts.throughput import ordinary_vocab
    from slice_parts.measure import profile_decode
    from slice_parts.parts import PROFILE_DECODE_S  # the window slice_serve profiles

    vocab = ordinary_vocab(arm)
    table = {}
    for c in concurrencies:
        ttft_ms = entry.get("throughput", {}).get(str(c), {}).get("ttft_ms_median") or 1000.0
        try:
            table[str(c)] = profile_decode(arm, trace_dir(out, arm), c, THROUGHPUT_IN, vocab, ttft_ms / 1e3,
                                           PROFILE_DECODE_S, PROFILE_MAX_TOKENS)
        except Exception as exc:  # noqa: BLE001 - the other concurrencies and arms still count
            table[str(c)] = {"error": f"{type(exc).__name__}: {exc}"}
    return table


def _metrics(arm: Arm) -> str:
    import urllib.request

    with urllib.request.urlopen(arm.base + "/metrics", timeout=30) as resp:
        return resp.read().decode()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", required=True)
    r.add_argument("--k", default="1,2", help="num_speculative_tokens values, comma-separated (K=0 always runs)")
    r.add_argument("--paths", default="shim,native", help="shim (the SM120 code path forced), native, or both")
    r.add_argument("--quant", default="Q8_0", choices=["Q8_0", "Q4_K", "F16", "BF16"])
    r.add_argument("--dtype", default="", choices=["", "auto", "float16", "bfloat16"])
    r.add_argument("--kv", default="auto", choices=["auto", "fp8_ds_mla"], help="--kv-cache-dtype of every server")
    r.add_argument("--tp", type=int, default=1)
    r.add_argument("--base-port", type=int, default=8300)
    r.add_argument("--start-timeout", type=float, default=600)
    r.add_argument("--throughput", default="1,4,32", help="concurrencies timed on the peaked-mtp arms ('' skips)")
    r.add_argument("--profile", default="", help="concurrencies at which each model's arms are profiled (torch "
                   "profiler, a decode window): a speculative step's kernel cost by group against K=0's ('' skips)")
    r.add_argument("--slice", default="", choices=["", "Q4_K_M", "Q8_0", "Q2_K", "Q3_K_M", "UD-IQ2_M-like"],
                   help="instead of the tiny models: a rank-of-8 slice of GLM-5 at its real sizes with its MTP layer "
                        "(make-slice --mtp), K=0 against every --k: the cost of a speculative step")
    r.add_argument("--slice-layers", type=int, default=4,
                   help="the slice's decoder layers (the first 1 dense up to 4 layers, else 3; GLM-5: 78): more "
                        "layers, more of a step is GPU time, as on the whole model")
    r.add_argument("--slice-peaked", action="store_true",
                   help="make-slice --peaked: the slice's MTP layer drafts its greedy tokens (acceptance near 1), "
                        "so the speed-up of speculative decoding shows where a step is GPU time")
    rep = sub.add_parser("report")
    rep.add_argument("dir")
    args = p.parse_args(argv)
    if args.cmd == "report":
        results = json.loads((Path(args.dir) / "mtp.json").read_text())
        text = report(results)
        (Path(args.dir) / "mtp.md").write_text(text)
        print(text)
        return 0
    if args.slice_peaked and not args.slice:
        p.error("--slice-peaked needs --slice PRESET")
    if args.slice and args.slice_layers < 2:
        p.error(f"--slice-layers {args.slice_layers}: expected at least 2 (a dense layer, then MoE)")
    if MODEL_ARGS["heads"] % args.tp:
        p.error(f"--tp {args.tp} does not divide the tiny model's {MODEL_ARGS['heads']} heads")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
