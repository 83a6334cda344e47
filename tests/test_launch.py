"""launch.sh: sourced it only sets PYTHONPATH (idempotently); executed it checks the model and the GPU, then runs
`vllm serve` with the recommended flags and passes the rest through.  A fake `vllm` on PATH records what it was
given; a fake `nvidia-smi` lists one GPU (or none)."""
from __future__ import annotations

import glob
import os
import pathlib
import subprocess
import sys

import pytest

from tests.helpers import REPO, write_other_architecture_gguf

LAUNCH = REPO / "launch.sh"
ONE_GPU = 'echo "GPU 0: NVIDIA H200 (UUID: GPU-00000000-0000-0000-0000-000000000000)"'


def _tool(bin_dir: pathlib.Path, name: str, body: str) -> None:
    tool = bin_dir / name
    tool.write_text(f"#!/usr/bin/env bash\n{body}\n")
    tool.chmod(0o755)


def _fake_vllm(tmp_path: pathlib.Path, nvidia_smi: str | None = ONE_GPU) -> dict:
    """Environment whose PATH starts with a fake vllm, a fake nvidia-smi (body `nvidia_smi`; None: no nvidia-smi
    anywhere on PATH) and this interpreter as python/python3."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _tool(bin_dir, "vllm",
          'printf "%s\\n" "$@" > "$FAKE_VLLM_ARGS"\necho "PYTHONPATH=$PYTHONPATH" >> "$FAKE_VLLM_ARGS"')
    for name in ("python", "python3"):
        _tool(bin_dir, name, f'exec "{sys.executable}" "$@"')
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "GLM5_MAX_MODEL_LEN", "GLM5_SHIM", "CUDA_VISIBLE_DEVICES")}
    if nvidia_smi is None:
        env["PATH"] = f"{bin_dir}:{_path_without(tmp_path / 'path', 'nvidia-smi', env['PATH'])}"
    else:
        _tool(bin_dir, "nvidia-smi", nvidia_smi)
        env["PATH"] = f"{bin_dir}:{env['PATH']}"
    env["FAKE_VLLM_ARGS"] = str(tmp_path / "args.txt")
    return env


def _path_without(link_dir: pathlib.Path, missing: str, path: str) -> str:
    """One directory of links to everything on `path` except `missing`."""
    link_dir.mkdir()
    for directory in path.split(os.pathsep):
        for entry in (os.scandir(directory) if os.path.isdir(directory) else ()):
            link = link_dir / entry.name
            if entry.name != missing and not link.exists() and os.access(entry.path, os.X_OK):
                link.symlink_to(entry.path)
    return str(link_dir)


def _vllm_args(tmp_path: pathlib.Path) -> list[str] | None:
    """What the fake vllm was called with; None when it was not called."""
    args = tmp_path / "args.txt"
    return args.read_text().split("\n") if args.exists() else None


def _refused(tmp_path: pathlib.Path, proc: subprocess.CompletedProcess) -> str:
    """launch.sh stopped before vllm with exit status 2 and one line on stderr; return that line."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert _vllm_args(tmp_path) is None
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("launch.sh: "), proc.stderr
    return lines[0]


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> pathlib.Path:
    """A valid tiny glm-dsa GGUF (context_length 8192), written once for the module."""
    from glm5_shim.gguf.fixture import make_tiny

    return make_tiny(tmp_path_factory.mktemp("launch") / "tiny.gguf", quant="Q8_0", layers=2,
                     write_reference=False)[0]


@pytest.fixture(scope="module")
def missing_tensor_gguf(tmp_path_factory) -> pathlib.Path:
    from glm5_shim.gguf.fixture import make_tiny

    return make_tiny(tmp_path_factory.mktemp("launch") / "no_q_b.gguf", quant="Q8_0", layers=2,
                     write_reference=False,
                     tensor_hook=lambda name, array: None if name == "blk.1.attn_q_b.weight" else array)[0]


@pytest.fixture(scope="module")
def truncated_gguf(tiny_gguf, tmp_path_factory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("launch") / "cut.gguf"
    path.write_bytes(tiny_gguf.read_bytes()[:-4096])
    return path


@pytest.fixture(scope="module")
def other_arch_gguf(tmp_path_factory) -> pathlib.Path:
    return write_other_architecture_gguf(tmp_path_factory.mktemp("launch") / "qwen.gguf")


def test_sourced_sets_only_pythonpath_once():
    out = subprocess.run(["bash", "-c", f"env | sort > /tmp/.before.$$; source {LAUNCH}; source {LAUNCH}; "
                          f"env | sort | comm -13 /tmp/.before.$$ - ; rm -f /tmp/.before.$$"],
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == [f"PYTHONPATH={REPO}"]


def test_executed_runs_vllm_serve_with_recommended_flags(tmp_path: pathlib.Path, tiny_gguf):
    env = _fake_vllm(tmp_path)
    proc = subprocess.run([str(LAUNCH), str(tiny_gguf), "-tp", "2"], env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    args = _vllm_args(tmp_path)
    assert args[:4] == ["serve", str(tiny_gguf), "--max-model-len", "8192"]  # the model's own context
    assert args[4:6] == ["-tp", "2"] and f"PYTHONPATH={REPO}" in args


def test_user_flags_win(tmp_path: pathlib.Path, tiny_gguf):
    env = _fake_vllm(tmp_path)
    subprocess.run([str(LAUNCH), str(tiny_gguf), "--max-model-len=8192"], env=env, check=True)
    args = _vllm_args(tmp_path)
    assert args.count("--max-model-len") == 0 and "--max-model-len=8192" in args


def test_missing_model_is_one_clear_line(tmp_path: pathlib.Path):
    proc = subprocess.run([str(LAUNCH), str(tmp_path / "nope.gguf")], env=_fake_vllm(tmp_path),
                          capture_output=True, text=True)
    assert "nope.gguf" in _refused(tmp_path, proc)


def test_default_max_model_len_is_capped_by_the_models_own_context(tmp_path: pathlib.Path, tiny_gguf):
    """vLLM refuses a --max-model-len above the model's context: a GGUF with a short one gets its own."""
    env = _fake_vllm(tmp_path)
    subprocess.run([str(LAUNCH), str(tiny_gguf)], env=env, check=True)
    assert _vllm_args(tmp_path)[:4] == ["serve", str(tiny_gguf), "--max-model-len", "8192"]
    subprocess.run([str(LAUNCH), str(tiny_gguf)], env=dict(env, GLM5_MAX_MODEL_LEN="4096"), check=True)
    assert _vllm_args(tmp_path)[2:4] == ["--max-model-len", "4096"]


# --- the GGUF check: the shim's own one-line error before vLLM starts -------------------------------------------

@pytest.mark.parametrize("which, names", [
    ("missing_tensor_gguf", "tensor blk.1.attn_q_b.weight is missing"),
    ("truncated_gguf", "truncated file: tensor blk."),
])
def test_bad_glm_dsa_gguf_is_one_line_and_vllm_never_starts(tmp_path: pathlib.Path, request, which, names):
    model = request.getfixturevalue(which)
    proc = subprocess.run([str(LAUNCH), str(model), "-tp", "2"], env=_fake_vllm(tmp_path),
                          capture_output=True, text=True)
    line = _refused(tmp_path, proc)
    assert f"launch.sh: {model}: " in line and names in line, line


def test_bad_gguf_error_is_the_shims_own_text(tmp_path: pathlib.Path, missing_tensor_gguf):
    """The line is exactly the GGUFError the shim raises from vLLM's get_config, behind launch.sh's prefix."""
    from glm5_shim.loading.hf_config import config_dict_from_gguf
    from glm5_shim.gguf.errors import GGUFError

    with pytest.raises(GGUFError) as raised:
        config_dict_from_gguf(missing_tensor_gguf)
    proc = subprocess.run([str(LAUNCH), str(missing_tensor_gguf)], env=_fake_vllm(tmp_path),
                          capture_output=True, text=True)
    assert _refused(tmp_path, proc) == f"launch.sh: {raised.value}"


def test_unreadable_gguf_is_refused(tmp_path: pathlib.Path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    proc = subprocess.run([str(LAUNCH), str(model)], env=_fake_vllm(tmp_path), capture_output=True, text=True)
    assert str(model) in _refused(tmp_path, proc)


def test_other_architecture_passes_through_to_vllm(tmp_path: pathlib.Path, other_arch_gguf):
    proc = subprocess.run([str(LAUNCH), str(other_arch_gguf)], env=_fake_vllm(tmp_path),
                          capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert _vllm_args(tmp_path)[:4] == ["serve", str(other_arch_gguf), "--max-model-len", "32768"]  # the default


@pytest.mark.parametrize("model", ["zai-org/GLM-5", "unsloth/GLM-5-GGUF:Q4_K_M"])
def test_repo_ids_pass_through_to_vllm(tmp_path: pathlib.Path, model):
    proc = subprocess.run([str(LAUNCH), model], env=_fake_vllm(tmp_path), capture_output=True, text=True,
                          cwd=tmp_path)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert _vllm_args(tmp_path)[:2] == ["serve", model]


@pytest.fixture(scope="module")
def trunk_only_gguf(tmp_path_factory) -> pathlib.Path:
    """llama.cpp's convert_hf_to_gguf.py --no-mtp: no MTP layer."""
    from glm5_shim.gguf.fixture import make_tiny

    return make_tiny(tmp_path_factory.mktemp("launch") / "trunk.gguf", quant="Q8_0", layers=2,
                     write_reference=False, split_mtp="trunk")[0]


MTP = '{"method": "mtp", "num_speculative_tokens": 2}'


@pytest.mark.parametrize("args", [["--speculative-config", MTP], [f"--speculative-config={MTP}"], ["-sc", MTP],
                                  ["-tp", "1", "--speculative-config", '{"model": "%s", "num_speculative_tokens": 1}']])
def test_an_mtp_draft_of_a_file_without_its_mtp_layer_is_one_line(tmp_path: pathlib.Path, trunk_only_gguf, args):
    from glm5_shim.preflight import problem

    args = [a.replace("%s", str(trunk_only_gguf)) for a in args]
    proc = subprocess.run([str(LAUNCH), str(trunk_only_gguf), *args], env=_fake_vllm(tmp_path),
                          capture_output=True, text=True)
    line = _refused(tmp_path, proc)
    assert line == f"launch.sh: {problem(str(trunk_only_gguf), MTP)}"
    assert "has no multi-token-prediction (MTP) layer" in line


def test_a_file_with_its_mtp_layer_starts_with_the_flag(tmp_path: pathlib.Path, tiny_gguf, trunk_only_gguf):
    env = _fake_vllm(tmp_path)
    proc = subprocess.run([str(LAUNCH), str(tiny_gguf), "--speculative-config", MTP], env=env, capture_output=True,
                          text=True)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert _vllm_args(tmp_path)[4:6] == ["--speculative-config", MTP]
    # the trunk-only file serves without a draft, or with another method
    for extra in ([], ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2}']):
        proc = subprocess.run([str(LAUNCH), str(trunk_only_gguf), *extra], env=env, capture_output=True, text=True)
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr


@pytest.mark.parametrize("value", ["0", "off", " False "])
def test_shim_off_skips_the_gguf_check(tmp_path: pathlib.Path, truncated_gguf, value):
    proc = subprocess.run([str(LAUNCH), str(truncated_gguf)], env=dict(_fake_vllm(tmp_path), GLM5_SHIM=value),
                          capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert _vllm_args(tmp_path)[:2] == ["serve", str(truncated_gguf)]


# --- no visible GPU: one line instead of vLLM's "Failed to infer device type" ---------------------------------

@pytest.mark.parametrize("nvidia_smi, said", [
    ('echo "No devices were found"; exit 6', "No devices were found"),
    ("echo \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\"; echo; echo more; "
     "exit 9", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."),
    ("exit 0", "no GPU listed, exit status 0"),
])
def test_no_gpu_listed_by_nvidia_smi(tmp_path: pathlib.Path, tiny_gguf, nvidia_smi, said):
    proc = subprocess.run([str(LAUNCH), str(tiny_gguf)], env=_fake_vllm(tmp_path, nvidia_smi=nvidia_smi),
                          capture_output=True, text=True)
    assert _refused(tmp_path, proc) == f"launch.sh: no CUDA GPU visible (nvidia-smi: {said}); vLLM needs one to serve"


@pytest.mark.skipif(bool(glob.glob("/proc/driver/nvidia/gpus/*")),
                    reason="the NVIDIA driver lists GPUs here: launch.sh accepts them without nvidia-smi")
def test_no_nvidia_smi(tmp_path: pathlib.Path, tiny_gguf):
    proc = subprocess.run([str(LAUNCH), str(tiny_gguf)], env=_fake_vllm(tmp_path, nvidia_smi=None),
                          capture_output=True, text=True)
    assert _refused(tmp_path, proc) == "launch.sh: no CUDA GPU visible (nvidia-smi: not found); vLLM needs one to serve"


@pytest.mark.parametrize("value", ["", "-1", "-1,0"])
def test_cuda_visible_devices_hides_every_gpu(tmp_path: pathlib.Path, tiny_gguf, value):
    proc = subprocess.run([str(LAUNCH), str(tiny_gguf)],
                          env=dict(_fake_vllm(tmp_path), CUDA_VISIBLE_DEVICES=value), capture_output=True, text=True)
    assert _refused(tmp_path, proc) == (f'launch.sh: no CUDA GPU visible (CUDA_VISIBLE_DEVICES="{value}"); '
                                        f"vLLM needs one to serve")


def test_cuda_visible_devices_naming_a_gpu_passes(tmp_path: pathlib.Path, tiny_gguf):
    subprocess.run([str(LAUNCH), str(tiny_gguf)], env=dict(_fake_vllm(tmp_path), CUDA_VISIBLE_DEVICES="0"),
                   check=True)
    assert _vllm_args(tmp_path)[:2] == ["serve", str(tiny_gguf)]


def test_the_gguf_is_checked_before_the_gpu(tmp_path: pathlib.Path, truncated_gguf):
    """A bad file is worth knowing about on any machine."""
    proc = subprocess.run([str(LAUNCH), str(truncated_gguf)], env=_fake_vllm(tmp_path, nvidia_smi="exit 6"),
                          capture_output=True, text=True)
    assert "truncated file" in _refused(tmp_path, proc)


def test_a_check_that_cannot_run_warns_and_leaves_the_verdict_to_vllm(tmp_path: pathlib.Path, tiny_gguf):
    """E.g. `python` is not the environment vLLM and the shim's dependencies live in."""
    env = _fake_vllm(tmp_path)
    _tool(tmp_path / "bin", "python", 'echo "ModuleNotFoundError: No module named gguf" >&2; exit 1')
    proc = subprocess.run([str(LAUNCH), str(tiny_gguf)], env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and _vllm_args(tmp_path)[:2] == ["serve", str(tiny_gguf)]
    assert proc.stderr.splitlines() == [
        "ModuleNotFoundError: No module named gguf",
        "launch.sh: WARNING: the GGUF check failed to run (exit 1); starting vLLM anyway"]
