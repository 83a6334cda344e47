"""bench/e2e.py's client side, against a stand-in OpenAI server (tests/fake_openai_server.py) on this CPU machine.

The GPU run (tests/gpu/test_e2e_serve.py) talks to real `vllm serve` processes; this checks, without a GPU,
that the harness parses vLLM's response shapes, counts what it claims to count and reports what fails.
"""
from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time

import pytest

from tests.helpers import REPO, bench_module
from tests import fake_openai_server as fake

e2e = bench_module("e2e")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def arm(tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("fake") / "server.log"
    proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "fake_openai_server.py"), str(port)],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    a = e2e.Arm("shim-q80-bf16", "Q8_0", "auto", "shim", port=port, proc=proc, log=log, model=fake.MODEL)
    a.startup_s = time.time()
    e2e.wait_ready(a, 30)
    yield a
    e2e.stop(a)
    assert proc.poll() is not None


def test_functional_checks_and_greedy_parsing(arm):
    res = e2e.functional(arm)
    assert res["checks"] and all(res["checks"].values()), res["checks"]
    g = res["greedy"]["sparse_600"]
    ids = fake.tokenize(e2e.prompts()["sparse_600"])
    assert g["prompt_ids"] == ids
    assert g["ids"] == fake.generate(ids, e2e.GEN_TOKENS)
    assert g["logprobs"] == [-0.25] * e2e.GEN_TOKENS
    assert g["top"][0] == {str(g["ids"][0]): -0.25, str((g["ids"][0] + 1) % fake.VOCAB): -3.0}
    assert g["prompt_logprobs"][0] is None and g["prompt_logprobs"][1:] == [-1.5] * (len(ids) - 1)
    assert res["chat"]["prompt_tokens"] == len(fake.tokenize(e2e.CHAT[0]["content"] + " " + e2e.CHAT[1]["content"])) \
        + fake.TEMPLATE_EXTRA


def test_bad_requests_get_400_and_the_server_stays_up(arm):
    ref = e2e.greedy(arm, e2e.prompts()["sparse_600"])
    res = e2e.bad_requests(arm, ref)
    for case in ("longer_than_max_model_len", "empty_prompt", "negative_max_tokens", "chat_messages_not_a_list",
                 "chat_message_without_role", "chat_content_not_text"):
        assert res[case]["status"] == 400 and res[case]["alive_after"], (case, res[case])
        assert res[case]["message"]
    assert res["next_request_same_tokens"] is True
    # and it notices a changed answer (the stand-in's top-2 gap is 2.75 nats: no near-tie to excuse it)
    ref = dict(ref, ids=ref["ids"][:-1] + [ref["ids"][-1] + 1])
    assert e2e.bad_requests(arm, ref)["next_request"] == {"same": False, "identical": e2e.GEN_TOKENS - 1,
                                                          "of": e2e.GEN_TOKENS, "gap_at_divergence": 2.75}


def test_same_answer_forgives_a_near_tie_only():
    before = {"ids": [1, 2, 3], "top": [{"1": -0.1, "9": -3.0}, {"2": -0.50, "7": -0.55}, {"3": -0.1, "4": -4.0}]}
    assert e2e.same_answer(before, [1, 2, 3]) == {"same": True, "identical": 3, "of": 3}
    assert e2e.same_answer(before, [1, 7, 3])["same"] is True  # 0.05-nat gap at the divergence
    assert e2e.same_answer(before, [9, 2, 3])["same"] is False
    assert e2e.same_answer(before, [1, 2])["same"] is False
    # a near-tie seen only by the second run also counts
    assert e2e.same_answer(before, [9, 2, 3], [{"9": -0.7, "1": -0.72}])["same"] is True


def test_repeatability_counts_distinct_answers(arm):
    rep = e2e.repeatability(arm, runs=3)
    assert rep["sparse_600"]["distinct_answers"] == 1 and rep["sparse_600"]["worst"]["same"]


def test_throughput_and_load_count_every_request(arm):
    vocab = e2e.ordinary_vocab(arm)
    assert vocab and all(0 <= t < fake.VOCAB for t in vocab)
    row = asyncio.run(e2e._throughput(arm, 4, 12, 50, 16, vocab))
    assert row["errors"] == 0 and row["requests"] == 12 and row["output_tok_s"] > 0
    assert row["ttft_ms_median"] > 0 and row["tpot_ms_median"] >= 0
    load = asyncio.run(e2e._load(arm, 4, 1.5, vocab))
    assert load["sent"] >= 4 and load["completed"] == load["sent"] and load["lost"] == 0
    assert load["errors_count"] == 0 and load["short"] == 0 and load["tokens"] > 0


def test_a_dead_server_is_reported_with_its_log(tmp_path):
    log = tmp_path / "dead.log"
    proc = subprocess.Popen([sys.executable, "-c", "print('boom: no GPU'); raise SystemExit(3)"],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT)
    a = e2e.Arm("native-q80-bf16", "Q8_0", "auto", "native", port=free_port(), proc=proc, log=log)
    a.startup_s = time.time()
    with pytest.raises(RuntimeError, match="(?s)exited with 3.*boom: no GPU"):
        e2e.wait_ready(a, 30)


def _greedy(ids, lps, prompt=(1, 2, 3)):
    return {"ids": list(ids), "logprobs": list(lps), "prompt_ids": list(prompt)}


def test_agreement_summary_and_report():
    a = {"p": _greedy([5, 6, 7, 8], [-0.1, -0.2, -0.3, -0.4])}
    b = {"p": _greedy([5, 6, 9, 8], [-0.15, -0.2, -0.5, -0.4])}
    rows = e2e.greedy_agreement(a, b)
    assert rows["p"]["identical"] == 2 and rows["p"]["of"] == 4 and rows["p"]["max_abs_dlogprob"] == 0.05
    results = {"tp": 1, "arms": {  # one pass each
        "shim-q80-bf16": {"quant": "Q8_0", "kv": "auto", "functional": {"greedy": a, "checks": {"x": True}},
                          "throughput": [{"concurrency": 1, "requests": 2, "in_len": 3, "out_len": 4,
                                          "output_tok_s": 90.0,
                                          "ttft_ms_median": 1, "ttft_ms_p99": 2, "tpot_ms_median": 3, "tpot_ms_p99": 4,
                                          "errors": 0}]},
        "native-q80-bf16": {"quant": "Q8_0", "kv": "auto", "functional": {"greedy": b, "checks": {"x": False}},
                            "throughput": [{"concurrency": 1, "requests": 2, "in_len": 3, "out_len": 4,
                                            "output_tok_s": 100.0, "ttft_ms_median": 1, "ttft_ms_p99": 2,
                                            "tpot_ms_median": 3, "tpot_ms_p99": 4, "errors": 0}]}},
        "reference": {"shim-q80-bf16": {"p": {"decode_abs_diff": [0.1, 0.3], "prefill_abs_diff": [0.2],
                                              "top1_agree": 2, "positions": 2, "min_ref_margin": 1.0}}}}
    e2e.summarize(results)
    assert results["agreement"]["q80-bf16"]["p"]["identical"] == 2
    assert results["throughput_ratio"]["q80-bf16"] == {1: 0.9}
    assert results["reference_summary"]["shim-q80-bf16"]["decode"]["max"] == 0.3
    md = e2e.report(results)
    assert "| p | 3 | 2/4 | 0.05 |" in md and "c=1 0.9×" in md and "| native-q80-bf16 | Q8_0 | auto | - | - | x |" in md


def test_the_whole_run_on_stand_in_servers(tmp_path):
    """`bench/e2e.py all` end to end with launch.sh swapped for the stand-in: models written, two servers started
    and stopped, every phase recorded, the report written.  The float32 reference step scores the stand-in's tokens
    where transformers has GlmMoeDsaForCausalLM (5.x, what pip resolves for vLLM 0.23 since December 2026); under
    transformers 4.57 it cannot, and its failure is reported, not fatal."""
    out = tmp_path / "run"
    env = dict(__import__("os").environ, GLM5_E2E_LAUNCH=str(REPO / "tests" / "fake_launch.sh"))
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "e2e.py"), "all", "--out", str(out),
                           "--arms", "shim-q80-bf16,native-q80-bf16", "--base-port", str(free_port()),
                           "--load-seconds", "2", "--requests-c1", "2", "--requests-c32", "8", "--in-len", "40",
                           "--out-len", "8", "--start-timeout", "60"],
                          env=env, capture_output=True, text=True, timeout=600, cwd=str(REPO))
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json

    res = json.loads((out / "results.json").read_text())
    shim, native = res["arms"]["shim-q80-bf16"], res["arms"]["native-q80-bf16"]
    assert all(shim["functional"]["checks"].values()) and all(native["functional"]["checks"].values())
    assert res["agreement"]["q80-bf16"]["sparse_600"]["identical"] == e2e.GEN_TOKENS
    assert ([r["concurrency"] for r in shim["throughput"]] == [1, 32, 1, 32, 32, 32]
            and set(res["throughput_ratio"]["q80-bf16"]) == {"1", "32", "32 (40/1)", "32 (64/256)"})
    assert shim["load"]["lost"] == 0 and shim["after_load_same_tokens"] and "load" not in native
    assert set(shim["after_load"]) == {"short", "sparse_600", "sparse_3000"}
    assert [r["pass"] for r in shim["throughput"]] == [1, 1, 2, 2, "split", "split"]
    assert shim["repeatability"]["sparse_1500"]["distinct_answers"] == 1
    assert shim["bad_requests"]["next_request_same_tokens"]
    assert (out / "models" / "tiny-Q8_0.gguf").exists() and (out / "models" / "tiny-Q8_0.reference").is_dir()
    md = (out / "e2e.md").read_text()
    assert "## Greedy agreement" in md and "## Load on shim-q80-bf16" in md and "## Throughput" in md
    assert "## Repeatability" in md
    try:
        from transformers import GlmMoeDsaForCausalLM  # noqa: F401
    except ImportError:
        assert "reference_error" in res and "## Float32 reference: failed" in md
    else:
        assert "reference_error" not in res, res["reference_error"]
        assert set(res["reference"]) == {"shim-q80-bf16", "native-q80-bf16"}
        assert "## Against the float32 reference" in md


def test_throughput_ratio_uses_the_warm_passes():
    def row(p, tok_s, conc=32):
        return {"concurrency": conc, "pass": p, "in_len": 8, "out_len": 8, "output_tok_s": tok_s}
    results = {"arms": {
        "shim-x": {"throughput": [row(1, 10.0), row(2, 90.0), row(3, 110.0), row("split", 50.0)]},
        "native-x": {"throughput": [row(1, 100.0), row(2, 100.0), row(3, 100.0), row("split", 40.0)]}}}
    e2e.summarize(results)
    assert results["throughput_ratio"]["x"] == {32: 1.0, "32 (8/8)": 1.25}  # the cold first pass is left out
