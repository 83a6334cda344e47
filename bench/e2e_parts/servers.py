"""The servers: one `vllm serve` per arm through launch.sh (GLM5_E2E_LAUNCH swaps in a stand-in), JSON over HTTP,
readiness, shutdown, and what each server's log says it chose."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from .arms import MAX_MODEL_LEN, Arm

REPO = Path(__file__).resolve().parents[2]
LAUNCH = Path(os.environ.get("GLM5_E2E_LAUNCH", REPO / "launch.sh"))  # tests swap in a stand-in server


# several servers share one GPU: each takes a fixed KV pool instead of a share of free memory
SHARED_GPU_LIMITS = ("--max-model-len", str(MAX_MODEL_LEN), "--gpu-memory-utilization", "0.05",
                     "--kv-cache-memory-bytes", str(1 << 30))


def free_port_from(port: int, tries: int = 200) -> int:
    """The first port at or after `port` that nothing listens on or holds: a fixed base plus an index can land on a
    port a client connection took as its ephemeral port (CI saw `address already in use` that way)."""
    import socket

    for p in range(port, port + tries):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p))
            except OSError:
                continue
            return p
    raise RuntimeError(f"no free port in {port}..{port + tries - 1}")


def assign_ports(arms: list[Arm], base: int) -> None:
    """Each arm its own free port, the first at or after base, the next after the one before."""
    port = base
    for arm in arms:
        arm.port = port = free_port_from(port)
        port += 1


def start(arm: Arm, models: dict[str, str], out: Path, tp: int, dtype: str = "", extra: tuple[str, ...] = (),
          limits: tuple[str, ...] = SHARED_GPU_LIMITS) -> None:
    """Start the arm's server (models: arm.quant → GGUF path); extra: more `vllm serve` arguments; limits: the
    length and memory flags (a server alone on its GPU passes its own)."""
    arm.model = models[arm.quant]
    arm.log = out / f"server_{arm.name}.log"
    cmd = ["bash", str(LAUNCH), arm.model, "--port", str(arm.port), *limits,
           "--kv-cache-dtype", arm.kv, "--seed", "0", "--max-num-seqs", "64",
           "--tensor-parallel-size", str(tp)] + (["--dtype", dtype] if dtype else []) + list(extra)
    arm.startup_s = time.time()
    arm.proc = subprocess.Popen(cmd, stdout=open(arm.log, "w"), stderr=subprocess.STDOUT, env=arm.env(),
                                start_new_session=True, cwd=str(REPO))


def http_json(url: str, body: dict | None = None, timeout: float = 60) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw)
        except ValueError:
            return exc.code, {"raw": raw.decode(errors="replace")[:500]}


def wait_ready(arm: Arm, timeout: float) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if arm.proc.poll() is not None:
            tail = arm.log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{arm.name}: server exited with {arm.proc.returncode}:\n{tail}")
        try:
            if http_json(arm.base + "/health", timeout=2)[0] == 200:
                arm.startup_s = round(time.time() - arm.startup_s, 1)
                return
        except (OSError, ValueError):
            pass
        time.sleep(1)
    raise RuntimeError(f"{arm.name}: not ready after {timeout:.0f} s; see {arm.log}")


def stop(arm: Arm) -> None:
    if arm.proc is None or arm.proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGINT, 20), (signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(arm.proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            arm.proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def alive(arm: Arm) -> bool:
    try:
        return arm.proc.poll() is None and http_json(arm.base + "/health", timeout=5)[0] == 200
    except OSError:
        return False


def backends_from_log(log: Path) -> str:
    """What the server says it chose (attention backend, indexer path), from its own log lines."""
    text = log.read_text(errors="replace") if log and log.exists() else ""
    found = [line.split("]", 1)[-1].strip()[:140] for line in text.splitlines()
             if "glm5-shim: using" in line or "glm5-shim: DSA indexer" in line
             or " backend." in line and "Using " in line]
    return " / ".join(dict.fromkeys(found)) or "-"
