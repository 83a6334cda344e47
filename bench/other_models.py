"""Other architectures' GGUFs served with the shim active and with GLM5_SHIM=0, on a GPU (issue #51).

    python bench/other_models.py run --out DIR [--archs llama,qwen3moe] [--types Q8_0,Q4_K_M,Q2_K]
    python bench/other_models.py compare DIR

`run` makes llama.cpp's own files of tiny random Llama and Qwen3-MoE models (bench/real_gguf.py OTHER_ARCHS: the
converter, then llama-quantize when LLAMA_QUANTIZE names a build or the cached one exists), then, for each file and
each arm (shim: the environment as it is; stock: GLM5_SHIM=0), one child process runs vLLM's offline `LLM` on it:
greedy continuations of a few prompts with the top-5 log-probabilities of every generated token, written to
DIR/<file>-<arm>.json.  `compare` (also run at the end of `run`) writes DIR/other_models.md: per file, whether both
arms loaded (or failed the same way), greedy tokens equal, and the largest |Δ log-prob| of the chosen tokens.  With
the shim's kernels scoped to glm-dsa files the two arms run the same kernels, so equal tokens and zero difference
are what the shim promises; any difference is the shim's doing.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

_BENCH = Path(__file__).resolve().parent
PROMPTS = ("The capital of France is", "def fibonacci(n):", "1, 2, 3, 4,", "Once upon a time")
GEN_TOKENS = 24

_CHILD = r"""
import json, sys
from vllm import LLM, SamplingParams
model, out = sys.argv[1], sys.argv[2]
try:
    llm = LLM(model=model, max_model_len=512, gpu_memory_utilization=0.3, enforce_eager=True, seed=0)
    params = SamplingParams(temperature=0, max_tokens=%d, logprobs=5, ignore_eos=True)
    rows = []
    for o in llm.generate(%r, params):
        c = o.outputs[0]
        rows.append({"ids": list(c.token_ids),
                     "logprobs": [{str(k): v.logprob for k, v in lp.items()} for lp in c.logprobs]})
    result = {"ok": True, "rows": rows}
except Exception as exc:
    result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
open(out, "w").write(json.dumps(result))
""" % (GEN_TOKENS, PROMPTS)


def run_arm(model: str, out: Path, stock: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GLM5_SHIM")}
    if stock:
        env["GLM5_SHIM"] = "0"
    env["VLLM_USE_FLASHINFER_SAMPLER"] = "0"
    proc = subprocess.run([sys.executable, "-c", _CHILD, model, str(out)], env=env, capture_output=True, text=True,
                          timeout=600)
    if not out.is_file():
        out.write_text(json.dumps({"ok": False, "error": f"exit {proc.returncode}: {proc.stderr[-500:]}"}))
    return json.loads(out.read_text())


def compare_pair(shim: dict, stock: dict) -> dict:
    """Both arms' results on one file: the same outcome, greedy tokens equal, the largest |Δ log-prob| of the tokens
    both chose (position by position, up to the first difference)."""
    if not shim["ok"] or not stock["ok"]:
        return {"loaded": False, "same_outcome": shim["ok"] == stock["ok"] and shim.get("error") == stock.get("error"),
                "error": shim.get("error") or stock.get("error")}
    equal, max_d = 0, 0.0
    for a, b in zip(shim["rows"], stock["rows"]):
        equal += a["ids"] == b["ids"]
        for tok_a, tok_b, la, lb in zip(a["ids"], b["ids"], a["logprobs"], b["logprobs"]):
            if str(tok_a) in lb:
                max_d = max(max_d, abs(la[str(tok_a)] - lb[str(tok_a)]))
            if tok_a != tok_b:  # the continuations differ from here: their log-probs compare different contexts
                break
    return {"loaded": True, "same_outcome": True, "greedy_equal": equal, "prompts": len(shim["rows"]),
            "max_dlogprob": round(max_d, 6)}


def compare(out: Path) -> str:
    lines = ["# Other architectures' GGUFs: shim active against GLM5_SHIM=0", "",
             "| file | loaded | same outcome | greedy equal | max |Δ log-prob| | error |", "|---|---|---|---|---|---|"]
    for shim_path in sorted(out.glob("*-shim.json")):
        name = shim_path.name[: -len("-shim.json")]
        stock_path = out / f"{name}-stock.json"
        if not stock_path.is_file():
            continue
        c = compare_pair(json.loads(shim_path.read_text()), json.loads(stock_path.read_text()))
        lines.append(f"| {name} | {c['loaded']} | {c['same_outcome']} | "
                     f"{str(c.get('greedy_equal', '-')) + ' / ' + str(c.get('prompts', '-'))} | "
                     f"{c.get('max_dlogprob', '-')} | {(c.get('error') or '')[:120]} |")
    text = "\n".join(lines) + "\n"
    (out / "other_models.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", required=True)
    r.add_argument("--archs", default="llama,qwen3moe")
    r.add_argument("--types", default="Q8_0,Q4_K_M,Q2_K")
    c = sub.add_parser("compare")
    c.add_argument("dir")
    args = p.parse_args(argv)
    if args.cmd == "compare":
        print(compare(Path(args.dir)))
        return 0
    sys.path.insert(0, str(_BENCH))
    import real_gguf

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tools = real_gguf.llama_tools()
    quantize = os.environ.get("LLAMA_QUANTIZE") or (str(tools["llama-quantize"]) if tools else None)
    types = [t for t in args.types.split(",") if t]
    for arch in args.archs.split(","):
        presets = [t for t in types if t not in ("BF16", "Q8_0")] if quantize else []
        files = real_gguf.make_other_real(out / "models" / arch, arch, presets=presets, llama_quantize=quantize)
        for kind, path in files.items():
            if kind not in types:
                continue
            for arm in ("shim", "stock"):
                res = run_arm(str(path), out / f"{arch}-{kind}-{arm}.json", stock=arm == "stock")
                print(f"[other] {arch} {kind} {arm}: {'ok' if res['ok'] else res['error'][:200]}", flush=True)
    print(compare(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
