"""bench/real_gguf's cache of llama.cpp's sdist and tools is shared by concurrent processes (pytest-xdist workers):
its lock lets one process at a time through."""
import subprocess
import sys
import textwrap

from tests.conftest import REPO

_HOLD = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, sys.argv[1])
    from bench.real_gguf import file_lock
    from pathlib import Path
    with file_lock(Path(sys.argv[2])):
        start = time.monotonic()
        time.sleep(0.4)
        print(start, time.monotonic())
    """
)


def test_file_lock_lets_one_process_in_at_a_time(tmp_path):
    lock = tmp_path / "sub" / "x.lock"  # its folder is made on first use
    procs = [subprocess.Popen([sys.executable, "-c", _HOLD, str(REPO), str(lock)], stdout=subprocess.PIPE,
                              text=True) for _ in range(3)]
    spans = sorted(tuple(map(float, p.communicate(timeout=60)[0].split())) for p in procs)
    assert all(p.returncode == 0 for p in procs)
    assert len(spans) == 3
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert start >= end, spans  # each holder entered after the previous one left
