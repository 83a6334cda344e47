"""doctor runs on a CPU-only machine, reports every patch, and tells what GLM-5 would use per GPU generation."""
from __future__ import annotations

import json
import subprocess
import sys

from tests.helpers import REPO, child_env, declared_patch_names


def _doctor(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "glm5_shim", "doctor", *args], env=child_env(env),
                          capture_output=True, text=True, timeout=300, cwd=str(REPO))


def test_doctor_json_lists_every_patch_and_a_plan():
    proc = _doctor("--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)  # stdout is pure JSON: vLLM's log lines must not leak into it
    assert report["activation"] == "active"
    names = {p["name"] for p in report["patches"]}
    assert names == declared_patch_names() and {"speculators", "dtype-auto", "dtype-gate", "shared-indexer"} <= names
    for p in report["patches"]:
        # vllm.platforms.cuda needs the CUDA driver: on a CPU-only machine it cannot even be imported
        cuda_only = not report["gpus"] and p["target"] == "vllm.platforms.cuda"
        assert p["state"] == "applied" or (cuda_only and "cannot be imported here" in p["reason"]), p
    assert set(report["versions"]) == {"python", "vllm", "torch", "triton", "transformers", "gguf", "wrapt"}
    assert report["vllm_supported"] is True
    if not report["gpus"]:
        plans = {p["capability"]: p for p in report["plan_if"]}
        assert plans["9.0"]["attention"]["native"] == "FLASHMLA_SPARSE"
        assert plans["12.0"]["attention"]["native"] is None
        assert "compute capability not supported" in plans["12.0"]["attention"]["rejected"]["FLASHMLA_SPARSE"]
        assert plans["12.0"]["attention"]["dtype"] == "float16" and plans["8.6"]["attention"]["dtype"] == "bfloat16"
        assert plans["12.0"]["indexer"]["deepgemm"] is False
        assert "glm5-shim Triton sparse MLA" in plans["12.0"]["attention"]["uses"]
        assert "glm5-shim Triton indexer" in plans["8.6"]["indexer"]["uses"]
        assert plans["9.0"]["attention"]["uses"] == "FLASHMLA_SPARSE (native)"


def test_doctor_text_and_disabled_shim(tmp_path):
    text = _doctor()
    assert text.returncode == 0
    assert "patches:" in text.stdout and "speculators" in text.stdout and "versions: python" in text.stdout
    off = _doctor("--json", env={"GLM5_SHIM": "0"})
    report = json.loads(off.stdout)
    assert report["activation"] == "disabled"
    assert all(p["state"] == "disabled" for p in report["patches"])


def test_doctor_checks_a_model_without_a_gpu(tmp_path):
    from glm5_shim.gguf.fixture import make_tiny

    good = make_tiny(tmp_path / "m.gguf", layers=2, write_reference=False)[0]
    report = json.loads(_doctor(str(good), "--json").stdout)
    assert report["model"]["architecture"] == "glm-dsa" and report["model"]["errors"] == []
    per_gpu = {int(k): v for k, v in report["model"]["weight_bytes_per_gpu"].items()}
    assert per_gpu[8] < per_gpu[4] < per_gpu[2] < per_gpu[1]
    assert report["model"]["tp_split"]["clean"] == [1, 2, 4, 8]  # Q8_0: 32-value blocks split everywhere
    q4k = make_tiny(tmp_path / "q4k.gguf", quant="Q4_K", layers=2, write_reference=False)[0]
    assert "tensor parallel: TP1 split cleanly; TP2, TP4, TP8 would cut quantized blocks (refused at start-up)" \
        in _doctor(str(q4k)).stdout
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"nope")
    text = _doctor(str(bad)).stdout
    assert "1 error(s)" in text and "not a GGUF" in text


def test_doctor_says_whether_the_file_has_an_mtp_layer_and_the_flag(tmp_path):
    from glm5_shim.gguf.fixture import make_tiny

    flag = """--speculative-config '{"method": "mtp", "num_speculative_tokens": 1}'"""
    good = make_tiny(tmp_path / "m.gguf", layers=2, write_reference=False)[0]
    text = _doctor(str(good)).stdout
    line = next(line for line in text.splitlines() if line.startswith("  MTP layer"))
    assert line.startswith("  MTP layer blk.2: 27 tensors") and line.endswith(f"enable with {flag}"), line
    trunk = make_tiny(tmp_path / "trunk.gguf", layers=2, write_reference=False, split_mtp="trunk")[0]
    report = json.loads(_doctor(str(trunk), "--json").stdout)
    assert report["model"]["errors"] == [] and not report["model"]["mtp"]["available"]
    expected = "  MTP speculative decoding: unavailable: " + report["model"]["mtp"]["problem"]
    assert expected in _doctor(str(trunk)).stdout


def test_doctor_reports_the_indexer_layout_and_the_longest_context(tmp_path):
    from glm5_shim.gguf.fixture import make_tiny

    glm52 = make_tiny(tmp_path / "glm52.gguf", layers=7, indexer_types="glm52", context_length=1 << 20,
                      write_reference=False)[0]
    proc = _doctor(str(glm52), "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    model = report["model"]
    assert model["errors"] == [] and model["indexer_layout"]["pattern"] == "FFFSSSF"
    assert model["kv_cache_bytes_per_token"]["indexer_layers"] == 4
    assert model["kv_cache_bytes_per_token"]["total_fp8_ds_mla"] == 7 * 656 + 4 * 132
    # the table is for the smallest GPU seen, or a 96 GiB one without a GPU; a tiny model fits its whole 1M context
    gpu_bytes = min((g["memory_bytes"] for g in report["gpus"]), default=96 << 30)
    assert model["longest_context"]["assumptions"]["gpu_bytes"] == gpu_bytes
    assert [(r["tp"], r["bf16"], r["fp8_ds_mla"]) for r in model["longest_context"]["rows"]] \
        == [(tp, 1 << 20, 1 << 20) for tp in (1, 2, 4, 8)]
    text = _doctor(str(glm52)).stdout
    assert "  DSA indexer: F F F S S S F (4 full, 3 shared" in text
    assert ("  KV cache per token: 8592 B bf16, 5120 B with --kv-cache-dtype fp8_ds_mla "
            "(MLA in 7 layers + indexer in 4)") in text
    assert "  longest --max-model-len, one sequence (" in text
    assert "    TP8: bf16 KV 1048576 (model max), fp8_ds_mla KV 1048576 (model max)" in text
