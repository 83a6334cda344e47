"""glm5_shim.preflight: the shim's own one-line GGUF error for a model argument, without vLLM or torch."""
from __future__ import annotations

import subprocess
import sys

import pytest

from glm5_shim.preflight import main, problem
from glm5_shim.gguf.validate import ERROR, validate
from tests.helpers import REPO, child_env, last_json, run_python, write_other_architecture_gguf


def _no_q_b(name, array):
    return None if name == "blk.1.attn_q_b.weight" else array


def test_good_file_is_silent(small, capsys):
    assert problem(str(small("good").path)) is None
    assert main([str(small("good").path)]) == 0
    assert capsys.readouterr() == ("", "")


def test_bad_file_is_the_validators_first_error_on_one_line(small, capsys):
    bad = small("preflight-no-q_b", tensor_hook=_no_q_b)
    first = next(f.message for f in validate(bad.path) if f.level == ERROR)
    assert problem(str(bad.path)) == first
    assert main([str(bad.path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == first + "\n"
    assert str(bad.path) in first and "blk.1.attn_q_b.weight" in first


def test_several_errors_are_counted_on_the_same_line(small):
    def two_missing(name, array):
        return None if name in ("blk.0.attn_q_b.weight", "blk.1.attn_q_b.weight") else array
    bad = small("preflight-no-q_b-x2", tensor_hook=two_missing)
    line = problem(str(bad.path))
    assert "\n" not in line and "blk.0.attn_q_b.weight" in line
    assert f"(and 1 more problem(s): python -m glm5_shim inspect {bad.path})" in line


def test_truncated_file(small, tmp_path):
    path = tmp_path / "cut.gguf"
    path.write_bytes(small("good").path.read_bytes()[:-4096])
    line = problem(str(path))
    assert line.startswith(f"{path}: truncated file: tensor blk.")


def test_not_a_gguf_named_gguf(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04" + bytes(100))
    assert problem(str(path)).startswith(f"{path}: ")


def test_not_glm_dsa_is_vllms_business(tmp_path):
    path = tmp_path / "qwen.gguf"
    write_other_architecture_gguf(path)
    assert problem(str(path)) is None


@pytest.mark.parametrize("model", ["zai-org/GLM-5", "unsloth/GLM-5-GGUF:Q4_K_M", "/no/such/dir"])
def test_non_files_pass(model):
    assert problem(model) is None


def test_usage():
    assert main([]) == 64 and main(["a", "b"]) == 64 and main(["--help"]) == 0


def test_imports_neither_vllm_nor_torch(small):
    """Run as launch.sh runs it (repo on PYTHONPATH, so the shim is active in the process)."""
    proc = run_python(f"""
        import json, sys
        sys.modules["mistral_common"] = None
        from glm5_shim.preflight import main
        rc = main([{str(small("good").path)!r}])
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("vllm", "torch", "transformers", "triton"))
        print(json.dumps([rc, heavy]))
    """)
    assert last_json(proc) == [0, []]


def test_runs_as_a_module(small):
    bad = small("preflight-no-q_b", tensor_hook=_no_q_b)
    proc = subprocess.run([sys.executable, "-m", "glm5_shim.preflight", str(bad.path)], env=child_env(),
                          capture_output=True, text=True, cwd=str(REPO))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [problem(str(bad.path))]
