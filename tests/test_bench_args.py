"""The benchmarks refuse a malformed option before they touch a GPU (one line, argparse's exit 2)."""
import subprocess
import sys

import pytest

from tests.helpers import REPO, child_env


@pytest.mark.parametrize("value", ["12", "sm_120", "12.x", "12.0.1"])
def test_as_capability_must_be_major_dot_minor(tmp_path, value):
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "sparse_mla.py"), "--smoke-cpu", "--out", str(tmp_path),
                           "--as-capability", value], capture_output=True, text=True, timeout=300, env=child_env())
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert errors == [f"sparse_mla.py: error: argument --as-capability: expected MAJOR.MINOR such as 12.0 or 8.6, "
                      f"got {value!r}"], proc.stderr[-2000:]


def test_e2e_dtype_is_one_vllm_serves_glm5_in(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "e2e.py"), "all", "--out", str(tmp_path),
                           "--dtype", "float8"], capture_output=True, text=True, timeout=300, env=child_env())
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "argument --dtype: invalid choice: 'float8'" in errors[0], proc.stderr[-2000:]
    assert not any(tmp_path.iterdir())  # refused before any model or server


@pytest.mark.parametrize("value", ["layers=7", "[1, 2]"])
def test_e2e_model_args_must_be_a_json_object(tmp_path, value):
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "e2e.py"), "all", "--out", str(tmp_path),
                           "--model-args", value], capture_output=True, text=True, timeout=300, env=child_env())
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "argument --model-args: expected a JSON object" in errors[0], proc.stderr[-2000:]
    assert not any(tmp_path.iterdir())


def test_other_models_comparison_counts_equal_greedy_and_the_largest_logprob_difference():
    from tests.helpers import bench_module

    om = bench_module("other_models")
    a = {"ok": True, "rows": [{"ids": [5, 6], "logprobs": [{"5": -0.1, "7": -2.0}, {"6": -0.3}]},
                              {"ids": [1, 2], "logprobs": [{"1": -0.5}, {"2": -0.7}]}]}
    b = {"ok": True, "rows": [{"ids": [5, 6], "logprobs": [{"5": -0.1}, {"6": -0.35}]},
                              {"ids": [1, 3], "logprobs": [{"1": -0.4}, {"3": -0.1, "2": -9.0}]}]}
    got = om.compare_pair(a, b)
    assert got == {"loaded": True, "same_outcome": True, "greedy_equal": 1, "prompts": 2, "max_dlogprob": 8.3}
    failed = {"ok": False, "error": "KeyError: 'x'"}
    assert om.compare_pair(failed, dict(failed)) == {"loaded": False, "same_outcome": True, "error": "KeyError: 'x'"}
    assert not om.compare_pair(failed, a)["same_outcome"]
