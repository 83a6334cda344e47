"""bench/read_floor.read_pieces, the load-width probe (#15): every code piece of every row is read, once, in the file's
block layout and packed, with 2-byte and (where aligned) 16-byte loads — checked through the XOR of the words read
against the same XOR on the host, on the Triton interpreter.  A piece skipped, read twice or read at the wrong
offset changes the XOR (random bytes)."""
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_CHILD = r"""
import sys
import numpy as np
import torch
sys.path.insert(0, "bench")
import read_floor as rf

g = torch.Generator().manual_seed(5)
checked = []
for name in rf.PIECE_LAYOUTS:
    for packed in (False, True):
        stride, skip, pieces = rf.piece_layout(name, packed)
        aligned = rf.wide_loads_fit(name, packed)
        assert aligned == (stride % 16 == 0 and skip % 16 == 0)
        w = torch.randint(0, 256, (2 * rf.PIECE_ROWS, stride * 5), dtype=torch.uint8, generator=g)
        want = rf.pieces_reference(w, name, packed)
        for wide in (False, True) if aligned else (False,):
            for splits in (1, 3):
                got = int(np.bitwise_xor.reduce(rf.read_pieces(w, name, packed, wide, splits).reshape(-1).numpy()))
                assert got == want, (name, packed, wide, splits, got, want)
                checked.append((name, packed, wide, splits))
        # one byte changed in a code piece changes the XOR; a byte outside every piece does not
        w2 = w.clone()
        w2[0, skip + 5] ^= 1
        assert rf.pieces_reference(w2, name, packed) != want
        if skip:
            w3 = w.clone()
            w3[0, 0] ^= 1
            assert rf.pieces_reference(w3, name, packed) == want
    try:
        rf.read_pieces(torch.zeros(64, 3 * 34, dtype=torch.uint8), "Q8_0", False, True)
        raise AssertionError("16-byte loads of 2-byte aligned blocks were not refused")
    except ValueError as e:
        assert "2-byte loads only" in str(e)
print(len(checked))
"""


def test_read_pieces_reads_every_code_piece_once():
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-c", _CHILD], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Q4_K: file and packed layouts, both load widths; the 2-byte-aligned types: file layout 2-byte loads, packed both
    assert int(proc.stdout.split()[-1]) == (2 * 2 + 2 * 2) + 3 * (1 * 2 + 2 * 2)
