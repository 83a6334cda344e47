"""MTP servers of one slice side by side, each with its own environment, K and extra `vllm serve` flags: which
switch makes a failure go away.  Written to bisect the K=3 NaN prompt log-probs (bench/journal/2026-12-04.md).

  MTP_VARIANTS='{"name": [K, {"ENV": "value"}, "shim"|"native", ["--flag", "value"]], ...}' OUT=DIR \\
      python bench/mtp_env_variants.py          # MTP_LAYERS (default 40): the peaked UD-IQ2_M-like slice's layers

For each server and each of mtp.py's prompts: greedy tokens without log-probs, with log-probs, with prompt
log-probs (mtp.py's own request), and once more without (a server that failed a request must still answer).
DIR/variants.json: per server and request, the token ids and the positions of non-finite log-probs, or the error.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from e2e_parts.arms import Arm  # noqa: E402
from e2e_parts.functional import client  # noqa: E402
from e2e_parts.servers import assign_ports, start, stop, wait_ready  # noqa: E402

import mtp  # noqa: E402

REQUESTS = (("tokens", {}), ("logprobs", {"logprobs": 5}),
            ("prompt_logprobs", {"logprobs": 5, "extra_body": {"prompt_logprobs": 1}}), ("tokens again", {}))


class EnvArm(Arm):
    extra_env: dict = {}

    def env(self) -> dict[str, str]:
        return {**super().env(), **self.extra_env}


def ask(arm: Arm, prompt: str, kw: dict) -> dict:
    body = dict(model=arm.model, prompt=prompt, max_tokens=mtp.GEN_TOKENS, temperature=0, **kw)
    body.setdefault("extra_body", {}).update({"ignore_eos": True, "return_token_ids": True})
    try:
        choice = client(arm).completions.create(**body).choices[0].model_dump()
    except Exception as exc:  # noqa: BLE001 - the error is the result
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    lps = (choice.get("logprobs") or {}).get("token_logprobs") or []
    return {"ids": choice.get("token_ids"),
            "non_finite_logprobs": [i for i, v in enumerate(lps) if v is None or not math.isfinite(v)]}


def main() -> int:
    from glm5_shim.gguf.slice import make_slice

    out = Path(os.environ["OUT"])
    out.mkdir(parents=True, exist_ok=True)
    layers = int(os.environ.get("MTP_LAYERS", "40"))
    path = out / f"slice-r8-UD-IQ2_M-like-{layers}L-peaked-mtp.gguf"
    t0 = time.time()
    make_slice(path, layers=layers, dense_layers=3 if layers > 4 else 1, preset="UD-IQ2_M-like", mtp=True,
               rank_of=8, peaked=True)
    print(f"slice written in {time.time() - t0:.1f} s", flush=True)
    arms = []
    for name, (k, env, path_kind, flags) in json.loads(os.environ["MTP_VARIANTS"]).items():
        arm = EnvArm(name, "slice", "auto", path_kind)
        arm.extra_env, arm.k, arm.flags = env, k, tuple(flags)
        arms.append(arm)
    assign_ports(arms, 8400)
    for arm in arms:
        spec = ("--speculative-config", mtp.speculative_config(arm.k)) if arm.k else ()
        start(arm, {"slice": str(path)}, out, 1, "", spec + arm.flags)
    results: dict = {}
    try:
        for arm in arms:
            entry = results[arm.name] = {"k": arm.k, "env": arm.extra_env, "path": arm.path, "flags": arm.flags}
            try:
                wait_ready(arm, float(os.environ.get("MTP_START_TIMEOUT", "420")))
            except RuntimeError as exc:
                entry["start_error"] = str(exc)[-1500:]
                continue
            for prompt_name, prompt in mtp.prompts().items():
                for request, kw in REQUESTS:
                    entry[f"{prompt_name}/{request}"] = ask(arm, prompt, kw)
            (out / "variants.json").write_text(json.dumps(results, indent=1))
    finally:
        for arm in arms:
            stop(arm)
    (out / "variants.json").write_text(json.dumps(results, indent=1))
    for name, entry in results.items():
        errors = [k for k, v in entry.items() if isinstance(v, dict) and "error" in v]
        print(name, "start failed" if "start_error" in entry else f"failed requests: {errors or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
