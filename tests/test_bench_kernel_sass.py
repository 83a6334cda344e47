"""bench/kernel_sass.py offline (Triton's ptxas and cuobjdump, no GPU): every variant a decode MoE launches is in its
table (the 2026-12-03 rename had dropped the register-MMA rows without a word), each counted over its K loop."""
import os
import re
import subprocess
import sys

from tests.helpers import REPO


def test_every_decode_variant_is_counted_over_its_k_loop():
    # compiled, not interpreted: the kernels must be @triton.jit objects in that process
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "kernel_sass.py"), "--cc", "90", "--types", "Q4_K"],
                          capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {m.group(1): m.group(2).split(" | ") for m in re.finditer(r"^\| (tile|mma w13|mma w2) \| Q4_K \| (.*) \|$",
                                                                    proc.stdout, re.M)}
    assert set(rows) == {"tile", "mma w13", "mma w2"}, proc.stdout
    for label, cells in rows.items():
        per_weight, top = float(cells[4]), cells[-1]
        # a K loop decodes weights: hundreds of instructions, and the register-MMA loops' half-precision FMAs
        assert int(cells[2]) > 300 and 1.0 < per_weight < 20.0, (label, cells)
        assert label == "tile" or "HFMA2" in top, (label, top)
