"""launch.sh: sourced it only sets PYTHONPATH (idempotently); executed it runs `vllm serve` with the
recommended flags and passes the rest through.  A fake `vllm` on PATH records what it was given."""
from __future__ import annotations

import os
import pathlib
import subprocess

from tests.helpers import REPO

LAUNCH = REPO / "launch.sh"


def _fake_vllm(tmp_path: pathlib.Path) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "vllm"
    fake.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@" > "$FAKE_VLLM_ARGS"\n'
                    'echo "PYTHONPATH=$PYTHONPATH" >> "$FAKE_VLLM_ARGS"\n')
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GLM5_MAX_MODEL_LEN")}
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    env["FAKE_VLLM_ARGS"] = str(tmp_path / "args.txt")
    return env


def test_sourced_sets_only_pythonpath_once():
    out = subprocess.run(["bash", "-c", f"env | sort > /tmp/.before.$$; source {LAUNCH}; source {LAUNCH}; "
                          f"env | sort | comm -13 /tmp/.before.$$ - ; rm -f /tmp/.before.$$"],
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == [f"PYTHONPATH={REPO}"]


def test_executed_runs_vllm_serve_with_recommended_flags(tmp_path: pathlib.Path):
    env = _fake_vllm(tmp_path)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    subprocess.run([str(LAUNCH), str(model), "-tp", "2"], env=env, check=True)
    args = (tmp_path / "args.txt").read_text().split("\n")
    assert args[:4] == ["serve", str(model), "--max-model-len", "32768"]
    assert args[4:6] == ["-tp", "2"] and f"PYTHONPATH={REPO}" in args


def test_user_flags_win(tmp_path: pathlib.Path):
    env = _fake_vllm(tmp_path)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    subprocess.run([str(LAUNCH), str(model), "--max-model-len=8192"], env=env, check=True)
    args = (tmp_path / "args.txt").read_text().split("\n")
    assert args.count("--max-model-len") == 0 and "--max-model-len=8192" in args


def test_missing_model_is_one_clear_line(tmp_path: pathlib.Path):
    proc = subprocess.run([str(LAUNCH), str(tmp_path / "nope.gguf")], env=_fake_vllm(tmp_path),
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "nope.gguf" in proc.stderr


def test_default_max_model_len_is_capped_by_the_models_own_context(tmp_path: pathlib.Path):
    """vLLM refuses a --max-model-len above the model's context: a GGUF with a short one gets its own."""
    from glm5_shim.gguf.fixture import make_tiny

    model = make_tiny(tmp_path / "tiny.gguf", layers=2, write_reference=False)[0]  # context_length 8192
    env = _fake_vllm(tmp_path)
    subprocess.run([str(LAUNCH), str(model)], env=env, check=True)
    assert (tmp_path / "args.txt").read_text().split("\n")[:4] == ["serve", str(model), "--max-model-len", "8192"]
    subprocess.run([str(LAUNCH), str(model)], env=dict(env, GLM5_MAX_MODEL_LEN="4096"), check=True)
    assert (tmp_path / "args.txt").read_text().split("\n")[2:4] == ["--max-model-len", "4096"]
