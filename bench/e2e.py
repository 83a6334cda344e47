"""End to end on a GPU: serve tiny GLM-5 GGUFs through `launch.sh`, talk to them over the OpenAI API, compare.

    python bench/e2e.py all --out DIR [--tp N] [--arms a,b,...] [--dtype float16] [--load-seconds 120] [--quick]
        one command for the whole check (one device call): writes the tiny models, starts one `vllm serve` per
        arm through launch.sh (all at once, each with its own small KV pool), then
          - functional: completions and chat completions, streaming and not, prompts below and far above
            index_topk; greedy token ids and log-probabilities of every arm;
          - bad requests at the server (too long, empty prompt, malformed chat message) and a good one after;
          - throughput: concurrency 1 and 32, output tokens/s, time to first token, time per output token;
          - load: 32 concurrent streaming clients for --load-seconds, then the same greedy request as before;
        stops the servers, then scores every arm's tokens against a float32 transformers reference of the
        model (teacher-forced on that arm's own tokens). DIR/results.json holds everything; DIR/e2e.md the tables.
    python bench/e2e.py report DIR      rewrite DIR/e2e.md from DIR/results.json

An arm is a model (Q8_0 or Q4_K tiny GGUF) × attention path × KV-cache dtype (the "-bf16" arms keep vLLM's "auto"
cache: the model dtype's 16 bits, fp16 under --dtype float16):
    shim   GLM5_SHIM_ATTENTION=triton GLM5_SHIM_INDEXER=triton  (the code paths SM120 takes)
    native vLLM's own choice on this GPU (FLASHMLA_SPARSE + DeepGEMM on an H200); the shim only loads the GGUF
The tiny models are `make-tiny --peaked` (see glm5_shim/gguf/fixture/weights.py: random weights whose next-token
choice is not chaotic, so that two correct engines can be compared token by token).
"""
from __future__ import annotations

import sys
from pathlib import Path

# The harness lives next to this file in e2e_parts/ (arms, prompts, servers, functional, throughput, reference,
# summary, report, run, command_line); this file is its entry point, and its names stay importable as e2e.<name>
# (tests/helpers.bench_module, bench/long_context.py).
_BENCH = Path(__file__).resolve().parent
if str(_BENCH.parent) not in sys.path:
    sys.path.insert(0, str(_BENCH.parent))  # run as a script from a checkout: the package is the one next to it
if str(_BENCH) not in sys.path:
    sys.path.append(str(_BENCH))  # imported by path (not run as a script): e2e_parts/ is found next to this file

from e2e_parts import command_line  # noqa: E402
from e2e_parts.arms import GEN_TOKENS, MAX_MODEL_LEN, MODEL_ARGS, SHIM_ENV, Arm, all_arms  # noqa: E402
from e2e_parts.command_line import model_args_json  # noqa: E402
from e2e_parts.functional import (NEAR_TIE, bad_requests, client, common_prefix, functional, greedy,  # noqa: E402
                                  repeatability, same_answer, top2_gap)
from e2e_parts.prompts import CHAT, prompts, words  # noqa: E402
from e2e_parts.reference import reference_scores  # noqa: E402
from e2e_parts.report import report  # noqa: E402
from e2e_parts.run import gpu_name, run_all  # noqa: E402
from e2e_parts.servers import LAUNCH, REPO, alive, backends_from_log, http_json, start, stop, wait_ready  # noqa: E402
from e2e_parts.summary import greedy_agreement, percentile99, quantiles, shim_native_pairs, summarize  # noqa: E402
from e2e_parts.throughput import _load, _throughput, ordinary_vocab, random_prompt, stream_one  # noqa: E402

__all__ = [
    "REPO", "LAUNCH", "SHIM_ENV", "MODEL_ARGS", "MAX_MODEL_LEN", "GEN_TOKENS", "Arm", "all_arms", "words", "prompts",
    "CHAT", "start", "http_json", "wait_ready", "stop", "alive", "client", "greedy", "NEAR_TIE", "common_prefix",
    "top2_gap", "same_answer", "functional", "repeatability", "bad_requests", "stream_one", "random_prompt",
    "_throughput", "_load", "ordinary_vocab", "reference_scores", "percentile99", "quantiles", "greedy_agreement",
    "shim_native_pairs", "summarize", "report", "backends_from_log", "run_all", "model_args_json", "gpu_name", "main",
]


def main() -> int:
    return command_line.main(__doc__)


if __name__ == "__main__":
    sys.exit(main())
