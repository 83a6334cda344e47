"""bench/mtp.py without a GPU: vLLM's own spec-decode counters (its SpecDecodingProm, exported by prometheus_client as
`vllm serve` exports them) parsed into acceptance, and the checks the report draws from a run's results."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import REPO, bench_module, child_env, last_json, run_python, script

mtp = bench_module("mtp")


def test_vllms_own_counters_parse_into_acceptance():
    """Two engines, K=2: drafts 5 + 3, 10 + 6 draft tokens, accepted 7 + 2 (per position 4 / 3 and 2 / 0)."""
    proc = run_python(script("""
        import json
        import prometheus_client
        from types import SimpleNamespace
        from vllm.v1.spec_decode.metrics import SpecDecodingProm, SpecDecodingStats

        prom = SpecDecodingProm(SimpleNamespace(num_speculative_tokens=2), ["model_name", "engine"],
                                {0: ["tiny.gguf", "0"], 1: ["tiny.gguf", "1"]})
        for engine, drafts in ((0, [(2, 2), (2, 2), (2, 1), (2, 1), (2, 1)]), (1, [(2, 1), (2, 1), (2, 0)])):
            stats = SpecDecodingStats.new(2)
            for draft_tokens, accepted in drafts:
                stats.observe_draft(draft_tokens, accepted)
            prom.observe(stats, engine)
        print(json.dumps({"text": prometheus_client.generate_latest().decode()}))
    """))
    text = last_json(proc)["text"]
    parsed = mtp.parse_spec_metrics(text)
    assert parsed == {"drafts": 8.0, "draft_tokens": 16.0, "accepted": 9.0, "per_position": {0: 7.0, 1: 2.0}}
    delta = mtp.metrics_delta(mtp.parse_spec_metrics(""), parsed)
    assert delta["acceptance"] == 9 / 16 and delta["per_position"] == {0: 7.0, 1: 2.0}


def _arm(model, path, k, ids, tops=None, metrics=None, **extra):
    greedy = {"p": {"prompt_ids": [1, 2], "ids": ids, "top": tops or [{"1": -0.1, "2": -5.0}] * len(ids)}}
    entry = {"model": model, "path": path, "k": k, "greedy": greedy, "seconds_per_token": 0.01}
    if metrics is not None:
        entry["metrics"] = metrics
    entry.update(extra)
    return entry


def _metrics(accepted, drafted, drafts=None):
    drafts = drafts if drafts is not None else drafted
    return {"drafts": drafts, "draft_tokens": drafted, "accepted": accepted, "per_position": {0: accepted},
            "acceptance": accepted / drafted if drafted else None}


def test_the_report_checks_equal_greedy_tokens_and_acceptance_against_the_reference():
    results = {"arms": {
        "peaked-mtp-shim-k0": _arm("peaked-mtp", "shim", 0, [5, 6, 7, 8]),
        "peaked-mtp-shim-k1": _arm("peaked-mtp", "shim", 1, [5, 6, 7, 8], metrics=_metrics(19, 20),
                                   reference_acceptance=1.0),
        "peaked-mtp-shim-k2": _arm("peaked-mtp", "shim", 2, [5, 6, 9, 9], metrics=_metrics(30, 40, 20)),
        "peaked-shim-k1": _arm("peaked", "shim", 1, [5, 6, 7, 8], metrics=_metrics(1, 20), reference_acceptance=0.0),
    }}
    lines = {check: (ok, detail) for check, ok, detail in mtp.summarize(results)}
    assert lines["peaked-mtp-shim-k1: greedy tokens equal the K=0 server's"][0] is True
    assert lines["peaked-mtp-shim-k2: greedy tokens equal the K=0 server's"][0] is False  # differs, no near-tie
    ok, detail = lines["peaked-mtp-shim-k1: acceptance as the reference's"]
    assert ok and "acceptance 0.950 (19/20" in detail and "float32 reference on these tokens 1.000" in detail
    assert lines["peaked-shim-k1: acceptance as the reference's"][0] is True  # 0.05 <= 0.0 + 0.1
    assert lines["peaked-mtp-shim-k2: acceptance high"][0] is False  # 0.75 < 0.8
    md = mtp.report(results)
    assert "| peaked-mtp-shim-k2: greedy tokens equal the K=0 server's | FAIL |" in md
    # a near-tie at the first difference counts as the same answer
    results["arms"]["peaked-mtp-shim-k0"]["greedy"]["p"]["top"][2] = {"7": -0.70, "9": -0.71}
    assert dict((c, ok) for c, ok, _ in mtp.summarize(results))[
        "peaked-mtp-shim-k2: greedy tokens equal the K=0 server's"]


def test_prompt_logprobs_with_a_draft_are_checked_against_k0():
    """What the H200 run of 2026-12-04 showed: with the draft, prompt log-probs off by nats (or NaN), tokens equal."""
    results = {"arms": {
        "peaked-mtp-shim-k0": _arm("peaked-mtp", "shim", 0, [5, 6]),
        "peaked-mtp-shim-k1": _arm("peaked-mtp", "shim", 1, [5, 6], metrics=_metrics(2, 2)),
    }}
    for name, lps in (("peaked-mtp-shim-k0", [None, -1.0, -2.0]), ("peaked-mtp-shim-k1", [None, -1.02, -2.0])):
        results["arms"][name]["greedy"]["p"]["prompt_logprobs"] = lps
    check = "peaked-mtp-shim-k1: prompt log-probs equal the K=0 server's"
    lines = {c: (ok, detail) for c, ok, detail in mtp.summarize(results)}
    assert lines[check] == (True, "largest difference 0.020 nats")
    for wrong in (-6.4, float("nan")):
        results["arms"]["peaked-mtp-shim-k1"]["greedy"]["p"]["prompt_logprobs"][2] = wrong
        assert dict((c, ok) for c, ok, _ in mtp.summarize(results))[check] is False
    del results["arms"]["peaked-mtp-shim-k0"]["greedy"]["p"]["prompt_logprobs"]   # nothing to compare: no line
    assert check not in dict((c, ok) for c, ok, _ in mtp.summarize(results))


def test_arms_and_a_server_that_failed():
    names = [a.name for a in mtp.all_arms(["shim", "native"], [1, 3])]
    assert names == ["peaked-mtp-shim-k0", "peaked-mtp-shim-k1", "peaked-mtp-shim-k3", "peaked-shim-k1",
                     "peaked-mtp-native-k0", "peaked-mtp-native-k1", "peaked-mtp-native-k3", "peaked-native-k1"]
    results = {"arms": {"peaked-shim-k1": {"model": "peaked", "path": "shim", "k": 1, "error": "RuntimeError: x"}}}
    assert mtp.summarize(results) == [("peaked-shim-k1 served", False, "RuntimeError: x")]
    assert json.loads(mtp.speculative_config(3)) == {"method": "mtp", "num_speculative_tokens": 3}
    # every server of a run takes --kv's cache dtype (the fp8_ds_mla arms of #17)
    assert {a.kv for a in mtp.all_arms(["shim", "native"], [1])} == {"auto"}
    assert {a.kv for a in mtp.all_arms(["shim", "native"], [1], kv="fp8_ds_mla")} == {"fp8_ds_mla"}


@pytest.mark.parametrize("args, message", [(["run", "--out", "x", "--tp", "3"], "does not divide"),
                                           (["run", "--out", "x", "--quant", "Q2_K"], "invalid choice"),
                                           (["run", "--out", "x", "--slice", "Q4_K_M", "--slice-layers", "1"],
                                            "expected at least 2")])
def test_bad_options_are_refused_before_any_model(tmp_path, args, message):
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "mtp.py"), *args], capture_output=True, text=True,
                          timeout=300, env=child_env(), cwd=tmp_path)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-2000:]
    assert not any(tmp_path.iterdir())


def test_the_throughput_table_gives_each_arms_ratio_to_k0_on_its_path():
    """tokens/s per concurrency and the ratio to the same path's K=0 arm; the K=0 row carries no ratio, an arm
    without a timed table is left out."""
    def tp(**by_c):
        return {c[1:]: {"output_tok_s": v, "errors": 0, "metrics": {"acceptance": 0.9}} for c, v in by_c.items()}

    results = {"arms": {
        "peaked-mtp-shim-k0": {"model": "peaked-mtp", "path": "shim", "k": 0,
                               "throughput": tp(c1=400.0, c32=7000.0)},
        "peaked-mtp-shim-k1": {"model": "peaked-mtp", "path": "shim", "k": 1,
                               "throughput": tp(c1=600.0, c32=3500.0)},
        "peaked-shim-k1": {"model": "peaked", "path": "shim", "k": 1},
    }}
    lines = mtp.throughput_lines(results)
    rows = {line.split("|")[1].strip(): line for line in lines if line.startswith("| peaked")}
    assert set(rows) == {"peaked-mtp-shim-k0", "peaked-mtp-shim-k1"}
    assert "x1.50, acc 0.90" in rows["peaked-mtp-shim-k1"] and "x0.50" in rows["peaked-mtp-shim-k1"]
    assert "(x" not in rows["peaked-mtp-shim-k0"]
    assert mtp.throughput_lines({"arms": {"a": {"model": "peaked-mtp", "path": "shim", "k": 0}}}) == []


def test_a_slice_run_has_its_own_arms_and_compares_each_k_with_its_own_k0():
    names = [a.name for a in mtp.all_arms(["shim"], [1, 3], slice_preset="Q4_K_M")]
    assert names == ["slice-mtp-shim-k0", "slice-mtp-shim-k1", "slice-mtp-shim-k3"]
    same = {"short": {"ids": [5, 6, 7], "logprobs": [-0.1, -0.2, -0.3], "top2_gap": [3.0, 3.0, 3.0]}}
    metrics = {"drafts": 10.0, "draft_tokens": 10.0, "accepted": 0.0, "per_position": {"0": 0.0}, "acceptance": 0.0}
    results = {"arms": {
        "slice-mtp-shim-k0": {"model": "slice-mtp", "path": "shim", "k": 0, "greedy": same,
                              "seconds_per_token": 0.01, "metrics": metrics,
                              "throughput": {"1": {"output_tok_s": 100.0, "errors": 0, "metrics": {}}}},
        "slice-mtp-shim-k1": {"model": "slice-mtp", "path": "shim", "k": 1, "greedy": same,
                              "seconds_per_token": 0.012, "metrics": metrics,
                              "throughput": {"1": {"output_tok_s": 80.0, "errors": 0,
                                                   "metrics": {"acceptance": 0.0}}}},
    }}
    checks = {check: ok for check, ok, _ in mtp.summarize(results)}
    assert checks["slice-mtp-shim-k1: greedy tokens equal the K=0 server's"] is True
    assert checks["slice-mtp-shim-k1: acceptance low"] is True
    assert any("x0.80" in line for line in mtp.throughput_lines(results))


def test_a_peaked_slice_run_expects_its_drafts_accepted():
    names = [a.name for a in mtp.all_arms(["shim"], [1], slice_preset="UD-IQ2_M-like", slice_peaked=True)]
    assert names == ["slice-peaked-mtp-shim-k0", "slice-peaked-mtp-shim-k1"]
    same = {"short": {"ids": [5, 6, 7], "logprobs": [-0.1, -0.2, -0.3], "top2_gap": [3.0, 3.0, 3.0]}}
    arm = lambda k, acc: {"model": "slice-peaked-mtp", "path": "shim", "k": k, "greedy": same,  # noqa: E731
                          "seconds_per_token": 0.01, "metrics": {"drafts": 10.0, "draft_tokens": 10.0,
                                                                 "accepted": 10.0 * acc, "per_position": {},
                                                                 "acceptance": acc}}
    for acc, ok in ((0.95, True), (0.1, False)):
        results = {"arms": {"slice-peaked-mtp-shim-k0": arm(0, 0.0), "slice-peaked-mtp-shim-k1": arm(1, acc)}}
        checks = {check: passed for check, passed, _ in mtp.summarize(results)}
        assert checks["slice-peaked-mtp-shim-k1: acceptance high"] is ok
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "mtp.py"), "run", "--out", "x", "--slice-peaked"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "--slice-peaked needs --slice" in proc.stderr


def test_the_profiled_step_cost_and_the_speed_up_it_allows():
    """--profile: a speculative arm's kernel µs a step against its K=0 arm's, by group; with 0.8 drafts accepted
    a step and a step costing 1.5x, kernel time allows at most (1 + 0.8) / 1.5 = x1.2."""
    plain = {"gguf_moe": 100.0, "gguf_dense": 50.0, "other": 50.0}
    spec = {"gguf_moe": 190.0, "gguf_dense": 60.0, "other": 50.0}
    results = {"arms": {
        "slice-peaked-mtp-shim-k0": {"model": "slice-peaked-mtp", "path": "shim", "k": 0,
                                     "profile": {"1": {"per_step_us": plain}}},
        "slice-peaked-mtp-shim-k1": {"model": "slice-peaked-mtp", "path": "shim", "k": 1,
                                     "throughput": {"1": {"metrics": {"drafts": 10.0, "accepted": 8.0}}},
                                     "profile": {"1": {"per_step_us": spec}, "32": {"error": "no trace"}}},
    }}
    sc = mtp.step_cost(results, "slice-peaked-mtp-shim-k1", "1")
    assert sc["cost"] == pytest.approx(1.5) and sc["accepted_per_step"] == pytest.approx(0.8)
    assert sc["allowed"] == pytest.approx(1.2) and sc["by_group"]["gguf_moe"] == (100.0, 190.0)
    assert mtp.step_cost(results, "slice-peaked-mtp-shim-k1", "32") is None
    text = "\n".join(mtp.profile_lines(results))
    assert "cost x1.50; accepted 0.80 a step: speed-up at most x1.20" in text
    assert "| gguf_moe | 100.0 | 190.0 | x1.90 |" in text
    assert "concurrency 32: no step cost (no trace)" in text
    assert "step wall" not in text  # no steps counted in these profiles: no wall time to show


def test_the_profiled_step_wall_time_shows_how_long_the_gpu_waits():
    """A profile that counted its steps and its GPU span gives the wall time a step, and the kernels' share of it:
    K=0 200 µs of kernels in 250 µs steps (80 % busy); K=1 300 µs in 500 µs (60 %), x2.00 the wall time."""
    results = {"arms": {
        "slice-peaked-mtp-shim-k0": {"model": "slice-peaked-mtp", "path": "shim", "k": 0, "profile": {"1": {
            "per_step_us": {"gguf_moe": 150.0, "other": 50.0}, "steps": 40, "gpu_span_us": 10_000.0}}},
        "slice-peaked-mtp-shim-k1": {"model": "slice-peaked-mtp", "path": "shim", "k": 1, "profile": {"1": {
            "per_step_us": {"gguf_moe": 240.0, "other": 60.0}, "steps": 20, "gpu_span_us": 10_000.0}}},
    }}
    sc = mtp.step_cost(results, "slice-peaked-mtp-shim-k1", "1")
    assert sc["span_us"] == [250.0, 500.0] and sc["kernel_us"] == (200.0, 300.0)
    text = "\n".join(mtp.profile_lines(results))
    assert "| **step wall µs** (profiled window ÷ steps) | 250.0 | 500.0 | x2.00 |" in text
    assert "| GPU busy (kernels ÷ wall) | 80 % | 60 % | |" in text
    assert "host side a step" not in text  # these profiles carry no CUDA calls


def test_the_host_side_of_a_step_lists_both_arms_cuda_calls():
    """The CUDA calls a step of each arm (slice_parts' group_trace: µs and calls a step), the union of both lists;
    a call only one arm made shows '-' on the other side."""
    base = {"per_step_us": {"other": 10.0}, "host_step_us": 900.0,
            "runtime_per_step": {"cudaGraphLaunch": [40.0, 1.0], "cudaLaunchKernel": [20.0, 4.0]}}
    spec = {"per_step_us": {"other": 12.0}, "host_step_us": 1500.0,
            "runtime_per_step": {"cudaLaunchKernel": [300.0, 60.0], "cudaStreamSynchronize": [2500.0, 2.0],
                                 "cudaGraphLaunch": [80.0, 2.0]}}
    results = {"arms": {
        "slice-peaked-mtp-shim-k0": {"model": "slice-peaked-mtp", "path": "shim", "k": 0, "profile": {"1": base}},
        "slice-peaked-mtp-shim-k1": {"model": "slice-peaked-mtp", "path": "shim", "k": 1, "profile": {"1": spec}},
    }}
    text = "\n".join(mtp.profile_lines(results))
    assert "slice-peaked-mtp-shim-k1, concurrency 1: host side a step (µs, calls), K=0 → K=1" in text
    assert "| step annotation µs | 900.0 | 1500.0 |" in text
    assert "| cudaLaunchKernel | 20.0 (4) | 300.0 (60) |" in text
    assert "| cudaStreamSynchronize | - | 2500.0 (2) |" in text
    assert text.index("| cudaGraphLaunch |") < text.index("| cudaLaunchKernel |") < text.index("| cudaStreamSync")
