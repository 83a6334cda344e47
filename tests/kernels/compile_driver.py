"""Offline compilation for the compile-target tests: a driver script run in a child process without
TRITON_INTERPRET (this process interprets kernels), printing one ``RESULT {json}`` line per kernel variant."""
import json
import os
import subprocess
import sys


def compile_records(script: str, cc: int, repo_root, timeout: int = 1200) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(repo_root) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", script, str(cc)], cwd=repo_root, env=env, capture_output=True,
                          text=True, timeout=timeout)
    recs = [json.loads(line[len("RESULT "):]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and recs, f"compile driver failed:\n{proc.stderr[-3000:]}"
    return recs
