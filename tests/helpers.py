"""Shared test helpers: run Python in a fresh interpreter with the repo on PYTHONPATH (as launch.sh does)."""
from __future__ import annotations

import contextlib
import json
import os
import pathlib
import subprocess
import sys
import textwrap

REPO = pathlib.Path(__file__).resolve().parents[1]


def child_env(extra: dict | None = None, pythonpath: list[str] | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GLM5_SHIM")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + (pythonpath or []))
    env["VLLM_LOGGING_LEVEL"] = "ERROR"  # vLLM logs to stdout; keep the child's stdout for results
    env.update(extra or {})
    return env


def script(*parts: str) -> str:
    """Join code snippets, each dedented on its own."""
    return "\n".join(textwrap.dedent(p) for p in parts)


def run_python(code: str, extra_env: dict | None = None, pythonpath: list[str] | None = None,
               timeout: int = 300, cwd: str | None = None) -> subprocess.CompletedProcess:
    """Run `code` as a script file (so that multiprocessing's spawn can re-import its __main__)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="glm5-shim-child-") as tmp:
        script = pathlib.Path(tmp) / "child.py"
        script.write_text(textwrap.dedent(code))
        return subprocess.run([sys.executable, str(script)], env=child_env(extra_env, pythonpath),
                              capture_output=True, text=True, timeout=timeout, cwd=cwd or str(REPO))


def last_json(proc: subprocess.CompletedProcess):
    """The child prints its result as the last stdout line, in JSON."""
    assert proc.returncode == 0, f"child failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def write_minimal_glm_dsa_gguf(path: pathlib.Path) -> pathlib.Path:
    """A GGUF whose architecture is glm-dsa: enough for code that only looks at the header."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "glm-dsa")
    writer.add_block_count(2)
    writer.add_context_length(4096)
    writer.add_embedding_length(256)
    writer.add_head_count(4)
    writer.add_tensor("output_norm.weight", np.ones(256, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# vLLM resolves no platform on a machine without a GPU (device_type ""), so EngineArgs cannot even build a
# DeviceConfig.  Children that build configs install vLLM's CPU platform first, before anything binds it.
USE_CPU_PLATFORM = """
import vllm.platforms as _platforms
from vllm.platforms.cpu import CpuPlatform as _CpuPlatform
_platforms._current_platform = _CpuPlatform()
"""


def write_other_architecture_gguf(path: pathlib.Path, arch: str = "qwen2") -> pathlib.Path:
    """A valid GGUF of another architecture (one tensor): not GLM-5, so the shim leaves it to vLLM."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_tensor("output_norm.weight", np.ones(64, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def load_in_cpu_harness(out: pathlib.Path, models: list, env: dict | None = None) -> list[dict]:
    """Load each GGUF through vLLM on the CPU (tests/vllm_cpu_harness.py, shim active): one result dict per model,
    its parameters in out/<i>.npz."""
    out.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "vllm_cpu_harness.py"), str(out),
                           *[str(m) for m in models]], env=child_env(env), capture_output=True, text=True,
                          timeout=1500, cwd=str(REPO))
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(results) == len(models), proc.stderr[-4000:]
    return results


def load_mtp_in_cpu_harness(out: pathlib.Path, models: list, env: dict | None = None) -> list[dict]:
    """Each GGUF through vLLM on the CPU with --speculative-config method mtp (tests/vllm_cpu_harness.py mtp): the
    target, then vLLM's MTP draft as its proposer loads it; one result dict per model, the draft's parameters in
    out/<i>-draft.npz."""
    out.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "vllm_cpu_harness.py"), "mtp", str(out),
                           *[str(m) for m in models]], env=child_env(env), capture_output=True, text=True,
                          timeout=1500, cwd=str(REPO))
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(results) == len(models), proc.stderr[-4000:]
    return results


def load_mtp_tp_in_cpu_harness(out: pathlib.Path, model, tp: int, timeout: float = 1500) -> list[dict]:
    """The target and its MTP draft loaded by `tp` ranks at once (tests/vllm_cpu_harness.py mtp-tp, gloo over a
    file): one result dict per rank, rank r's draft parameters in out/<r>-draft.npz.  The ranks are watched
    together: the first that fails stops the others at once (they would wait for it in the process group until
    the timeout): a crash is an assertion with its stderr, a reported failure (ok false) the only result returned."""
    import tempfile
    import time

    out.mkdir(parents=True, exist_ok=True)
    init_file = pathlib.Path(tempfile.mkdtemp(prefix="glm5-shim-tp-")) / "init"
    logs = [(out / f"{rank}.stdout", out / f"{rank}.stderr") for rank in range(tp)]
    files = [(open(o, "w"), open(e, "w")) for o, e in logs]
    procs = [subprocess.Popen([sys.executable, str(REPO / "tests" / "vllm_cpu_harness.py"), "mtp-tp", str(tp),
                               str(rank), str(init_file), str(out), str(model)], env=child_env(),
                              stdout=files[rank][0], stderr=files[rank][1], text=True, cwd=str(REPO))
             for rank in range(tp)]

    def result(rank: int) -> dict:
        lines = [json.loads(line) for line in logs[rank][0].read_text().splitlines() if line.startswith("{")]
        assert procs[rank].returncode == 0 and len(lines) == 1, (
            f"rank {rank} of {tp} exited with {procs[rank].returncode}: " + logs[rank][1].read_text()[-4000:])
        return lines[0]

    try:
        deadline, done = time.monotonic() + timeout, {}
        while len(done) < tp:
            for rank, proc in enumerate(procs):
                if rank not in done and proc.poll() is not None:
                    done[rank] = result(rank)
                    if not done[rank].get("ok"):   # the caller asserts on it; the other ranks need not finish
                        return [done[rank]]
            assert time.monotonic() < deadline, f"ranks {sorted(set(range(tp)) - set(done))} still running after " \
                                                f"{timeout} s"
            time.sleep(0.5)
        return [done[rank] for rank in range(tp)]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for handles in files:
            for f in handles:
                f.close()


@contextlib.contextmanager
def shim_in_this_process(*targets: str):
    """The shim active in the pytest process for a block of tests (targets imported, so their patches apply), and
    every patch undone afterwards: later tests in the same process see stock vLLM again.  Re-applies what an earlier
    block undid (wrapt's import hooks fire only once a module)."""
    import importlib

    import glm5_shim
    from glm5_shim.registry import REGISTRY

    glm5_shim.activate("tests")
    for name in targets:
        importlib.import_module(name)
    for patch in REGISTRY.patches():
        module = sys.modules.get(patch.target)
        if module is not None:
            REGISTRY.apply(patch, module)
    try:
        yield REGISTRY
    finally:
        REGISTRY.undo_all()


def declared_patch_names() -> set[str]:
    """Every patch the shim declares (glm5_shim.patches: one module per patch point; no vLLM import)."""
    import importlib

    from glm5_shim.patches import PATCH_MODULES

    return {p.name for m in PATCH_MODULES for p in importlib.import_module(f"glm5_shim.patches.{m}").PATCHES}


def bench_module(name: str):
    """Import bench/<name>.py (a script directory, not a package) once, under its own module name."""
    import importlib.util

    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


# llama.cpp's own files of the tiny model (bench/real_gguf.py): the converter's outtypes, and llama-quantize's
# presets where its build is at hand (LLAMA_QUANTIZE / LLAMA_IMATRIX, else the cached build; CI builds it)
LLAMA_REAL_OUTTYPES = ("BF16", "F16", "Q8_0")
# presets whose every type the generator can encode (IQ4_XS/IQ4_NL have no quantizer here)
LLAMA_REAL_PRESETS = ("Q4_0", "Q5_0", "Q2_K", "Q3_K_M", "Q4_K_S", "Q4_K_M", "Q5_K_M", "Q6_K")


def in_ci() -> bool:
    return bool(os.environ.get("CI") or os.environ.get("GLM5_SHIM_CI"))


def real_gguf_with_converter():
    """bench/real_gguf.py once llama.cpp's converter is at hand: in CI a missing sdist fails; elsewhere the calling
    test skips with the reason."""
    import pytest

    real_gguf = bench_module("real_gguf")
    try:
        real_gguf.llama_cpp_tree()
    except RuntimeError as exc:
        if in_ci():
            raise
        pytest.skip(f"llama.cpp's converter is not available here: {exc}")
    return real_gguf


def make_llama_real(root: pathlib.Path) -> tuple[pathlib.Path, dict]:
    """(root, name → GGUF) of llama.cpp's own tools on the tiny model.  In CI a missing sdist or a failed build of
    the tools fails; elsewhere the converter's absence skips, and the presets need a build at hand."""
    real_gguf = real_gguf_with_converter()
    quantize, imatrix = os.environ.get("LLAMA_QUANTIZE", ""), os.environ.get("LLAMA_IMATRIX", "")
    if not quantize:
        tools = real_gguf.llama_tools(build=in_ci())
        if tools:
            quantize, imatrix = str(tools["llama-quantize"]), str(tools["llama-imatrix"])
    presets = (LLAMA_REAL_PRESETS + ("IQ4_XS",) if quantize else ()) + \
        (tuple(real_gguf.IMATRIX_PRESETS) if quantize and imatrix else ())
    files = real_gguf.make_real(root, outtypes=[t.lower() for t in LLAMA_REAL_OUTTYPES], presets=presets,
                                llama_quantize=quantize or None, llama_imatrix=imatrix or None, seed=0)
    return root, files
