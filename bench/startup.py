"""Added interpreter start-up time of the shim: `python -c pass` with and without the repo on PYTHONPATH.

Usage: python bench/startup.py [--runs N]
Prints the median and the difference; the README quotes this figure.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]


def _time(env: dict, runs: int) -> list[float]:
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
        samples.append((time.perf_counter() - t0) * 1e3)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args()
    base = {k: v for k, v in os.environ.items() if not k.startswith("GLM5_SHIM") and k != "PYTHONPATH"}
    with tempfile.TemporaryDirectory() as empty:
        plain = dict(base, PYTHONPATH=empty)  # same sys.path length, no sitecustomize
        shim = dict(base, PYTHONPATH=str(REPO))
        off = dict(base, PYTHONPATH=str(REPO), GLM5_SHIM="0")
        _time(plain, 3), _time(shim, 3)  # warm the page cache
        rows = []
        # interleave to cancel drift
        a, b, c = [], [], []
        for _ in range(args.runs):
            a += _time(plain, 1)
            b += _time(shim, 1)
            c += _time(off, 1)
        for name, s in (("stock python", a), ("with glm5-shim", b), ("glm5-shim, GLM5_SHIM=0", c)):
            rows.append((name, statistics.median(s), min(s)))
    print(f"python {sys.version.split()[0]}, {args.runs} runs each, `python -c pass`")
    print("| interpreter | median ms | min ms |\n|---|---|---|")
    for name, med, low in rows:
        print(f"| {name} | {med:.1f} | {low:.1f} |")
    print(f"added by the shim: {rows[1][1] - rows[0][1]:+.1f} ms median, {rows[1][2] - rows[0][2]:+.1f} ms min")


if __name__ == "__main__":
    main()
