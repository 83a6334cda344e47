"""Offline compilation for the compile-target tests: a driver script run in a child process without
TRITON_INTERPRET (this process interprets kernels), printing one ``RESULT {json}`` line per kernel variant.

Given the module's ``targets``, the children of the next targets start while this one's test waits, one child a core
(each compiles on one: Triton's LLVM and ptxas are single-threaded), so a module's targets take about 1 / cores of the
serial time on CI's 2-core machine; a test still checks only its own target's records, and children nobody waited
for are killed at exit (a run of one target starts at most cores - 1 extra)."""
import atexit
import json
import os
import subprocess
import sys
import tempfile

_AHEAD = max(0, (os.cpu_count() or 1) - 1)
_STARTED: dict = {}   # (script, cc) -> (Popen, stdout file, stderr file)


def _start(script: str, cc: int, repo_root):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(repo_root) + os.pathsep + env.get("PYTHONPATH", "")
    out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")   # files, not pipes: nobody reads a pipe
    proc = subprocess.Popen([sys.executable, "-c", script, str(cc)], cwd=repo_root, env=env, stdout=out, stderr=err,
                            text=True)
    _STARTED[(script, cc)] = (proc, out, err)


@atexit.register
def _kill_unclaimed() -> None:
    for proc, _, _ in _STARTED.values():
        proc.kill()


def compile_records(script: str, cc: int, repo_root, timeout: int = 1200, targets=()) -> list[dict]:
    targets = list(targets)
    ahead = targets[targets.index(cc) + 1:][:_AHEAD] if cc in targets else []
    for target in (cc, *ahead):
        if (script, target) not in _STARTED:
            _start(script, target, repo_root)
    proc, out, err = _STARTED.pop((script, cc))
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    out.seek(0)
    err.seek(0)
    stdout, stderr = out.read(), err.read()
    recs = [json.loads(line[len("RESULT "):]) for line in stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and recs, f"compile driver failed for sm_{cc}:\n{stderr[-3000:]}"
    return recs
