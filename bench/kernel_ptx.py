"""The GGUF kernels' code, fingerprinted: every configuration the plans launch (gguf_matmul.kernel_configs and
gguf_mma.kernel_configs) compiled offline for each target, its PTX without line info hashed.  A move or a
restructuring of the kernel sources must leave every fingerprint unchanged (issue #53: behaviour shown unchanged).

    python bench/kernel_ptx.py dump --targets 120,121,89,86,80,90 --out before.json
    python bench/kernel_ptx.py compare before.json after.json      # exit 1 on any difference

One process a target (Triton's LLVM and ptxas are single-threaded), all targets at once up to the core count.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
from concurrent.futures import ProcessPoolExecutor

DEFAULT_TARGETS = (120, 121, 89, 86, 80, 90)


def normalized_ptx(ptx: str) -> str:
    """PTX without what moves when a source line moves: .loc / .file directives, the DWARF sections, comments."""
    ptx = re.sub(r"^\s*\.section\s+\.debug_\w+\s*\{.*?^\s*\}\s*$", "", ptx, flags=re.MULTILINE | re.DOTALL)
    kept = []
    for line in ptx.splitlines():
        stripped = line.strip()
        if stripped.startswith((".loc", ".file", "//")) or stripped.startswith("$L__") and "debug" in stripped:
            continue
        kept.append(line.split("//")[0].rstrip())
    return "\n".join(line for line in kept if line)


def config_key(cfg: dict) -> str:
    consts = ",".join(f"{k}={cfg['constexprs'][k]}" for k in sorted(cfg["constexprs"]))
    digest = hashlib.sha256(consts.encode()).hexdigest()[:8]   # the asm strings among them are long
    return f"{cfg['name']}|{cfg['kernel'].__name__}|w{cfg['num_warps']}|s{cfg['num_stages']}|{digest}"


def _target_fingerprints(cc: int) -> dict:
    os.environ.pop("TRITON_INTERPRET", None)
    from glm5_shim.kernels.gguf import register_mma
    from glm5_shim.kernels.gguf import tiles

    out = {}
    for cfg in tiles.kernel_configs() + register_mma.kernel_configs():
        if cfg.get("family") == "mma" and not tiles.mma_sync_target((cc // 10, cc % 10)):
            continue
        key = config_key(cfg)
        try:
            ptx = tiles.compile_offline(cfg, cc).asm["ptx"]
            out[key] = hashlib.sha256(normalized_ptx(ptx).encode()).hexdigest()[:16]
        except Exception as e:  # recorded, compared like a hash
            out[key] = f"error {type(e).__name__}"
    return out


def dump(targets, path: str) -> dict:
    workers = max(1, min(len(targets), os.cpu_count() or 1))
    with ProcessPoolExecutor(workers) as pool:
        result = {str(cc): fp for cc, fp in zip(targets, pool.map(_target_fingerprints, targets))}
    with open(path, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
    print(f"{path}: " + ", ".join(f"sm_{cc} {len(fp)} configurations" for cc, fp in result.items()))
    return result


def compare(before: dict, after: dict) -> list[str]:
    """One line per difference: a configuration gone, new, or with other code."""
    diffs = []
    for cc in sorted(set(before) | set(after)):
        b, a = before.get(cc, {}), after.get(cc, {})
        for key in sorted(set(b) | set(a)):
            if b.get(key) != a.get(key):
                diffs.append(f"sm_{cc} {key}: {b.get(key, 'absent')} -> {a.get(key, 'absent')}")
    return diffs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("--targets", default=",".join(map(str, DEFAULT_TARGETS)))
    d.add_argument("--out", required=True)
    c = sub.add_parser("compare")
    c.add_argument("before")
    c.add_argument("after")
    args = ap.parse_args(argv)
    if args.cmd == "dump":
        dump([int(t) for t in args.targets.split(",")], args.out)
        return 0
    with open(args.before) as f:
        before = json.load(f)
    with open(args.after) as f:
        after = json.load(f)
    diffs = compare(before, after)
    total = sum(len(v) for v in before.values())
    print(f"{total} configurations before, {sum(len(v) for v in after.values())} after, {len(diffs)} differ")
    for line in diffs:
        print(line)
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.exit(main())
