"""GLM-5 GGUFs written by llama.cpp's own tools, not by the project's imitation of them.

    python bench/real_gguf.py OUT_DIR [--outtypes bf16,q8_0] [--presets Q4_K_M] [--llama-quantize BIN] [make-tiny args]

1. `make_tiny` writes a tiny random GLM-5 and its HF checkpoint (`<stem>.reference/`);
2. llama.cpp's `convert_hf_to_gguf.py` (from the llama-cpp-python sdist, pinned below; downloaded once with pip into
   ~/.cache/glm5_shim) converts that checkpoint to `real-<outtype>.gguf`;
3. with `--llama-quantize BIN` (a build of llama.cpp's `llama-quantize`; it needs a C++ build, ~8 min on 2 cores,
   so it is never built here) each preset is quantized from the BF16 file to `real-<preset>.gguf`;
4. every file gets `<stem>.reference/` holding what it stores decoded to float32 (a float32 reference model then
   differs from an engine running the file only by arithmetic).

The converter runs unmodified except for one runtime override: its tokenizer pre-type is recognised by a hash of a
known vocabulary, which a synthetic vocabulary cannot match, so the pre-type is given (GLM's is "glm4").
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

LLAMA_CPP_PYTHON = "0.3.36"  # its vendored llama.cpp converts glm-dsa (GLM-5, 5.1 and 5.2, --mtp/--no-mtp)
CACHE = Path(os.environ.get("GLM5_SHIM_CACHE", Path.home() / ".cache" / "glm5_shim"))

# Run inside the converter's own interpreter: its gguf-py (not the installed gguf) and the pre-type override.
_CONVERT = """
import sys
sys.path.insert(0, sys.argv[1])
import convert_hf_to_gguf
from conversion.base import TextModel
TextModel.get_vocab_base_pre = lambda self, tokenizer: "glm4"
sys.argv = ["convert_hf_to_gguf.py"] + sys.argv[2:]
convert_hf_to_gguf.main()
"""


def llama_cpp_tree(cache: Path = CACHE) -> Path:
    """The vendored llama.cpp tree of the pinned llama-cpp-python sdist (downloaded and unpacked once)."""
    root = cache / f"llama-cpp-python-{LLAMA_CPP_PYTHON}"
    tree = root / f"llama_cpp_python-{LLAMA_CPP_PYTHON}" / "vendor" / "llama.cpp"
    if (tree / "convert_hf_to_gguf.py").is_file():
        return tree
    root.mkdir(parents=True, exist_ok=True)
    sdist = root / f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"
    if not sdist.is_file():
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                               f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", str(root)],
                              capture_output=True, text=True)
        if proc.returncode != 0 or not sdist.is_file():
            raise RuntimeError(f"could not download the llama-cpp-python {LLAMA_CPP_PYTHON} sdist: "
                               f"{(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")
    wanted = ("/vendor/llama.cpp/convert_hf_to_gguf.py", "/vendor/llama.cpp/conversion/",
              "/vendor/llama.cpp/gguf-py/gguf/", "/vendor/llama.cpp/models/templates/")
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if any(w in m.name for w in wanted)]
        tar.extractall(root, members=members, filter="data")
    if not (tree / "convert_hf_to_gguf.py").is_file():
        raise RuntimeError(f"{sdist}: no vendor/llama.cpp/convert_hf_to_gguf.py inside")
    return tree


def convert(checkpoint: Path, out: Path, outtype: str, *, extra: tuple[str, ...] = (),
            tree: Path | None = None) -> Path:
    """Run llama.cpp's convert_hf_to_gguf.py on an HF checkpoint directory."""
    tree = tree or llama_cpp_tree()
    proc = subprocess.run([sys.executable, "-c", _CONVERT, str(tree), str(checkpoint), "--outfile", str(out),
                           "--outtype", outtype, *extra], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(tree / "gguf-py")})
    if proc.returncode != 0 or not out.is_file():
        raise RuntimeError(f"convert_hf_to_gguf.py --outtype {outtype} failed:\n{proc.stderr[-3000:]}")
    return out


def quantize(binary: str, src: Path, out: Path, preset: str) -> Path:
    proc = subprocess.run([binary, str(src), str(out), preset, "2"], capture_output=True, text=True)
    if proc.returncode != 0 or not out.is_file():
        raise RuntimeError(f"llama-quantize {preset} failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    return out


def make_real(out_dir: Path, outtypes=("bf16", "q8_0"), presets=(), llama_quantize: str | None = None,
              **tiny_args) -> dict[str, Path]:
    """Write the tiny model's checkpoint and the real tools' GGUFs of it; returns name → GGUF path."""
    from glm5_shim.gguf.fixture import make_tiny, reference_dir, write_dequantized_reference

    out_dir.mkdir(parents=True, exist_ok=True)
    source = out_dir / "source.gguf"
    make_tiny(source, quant="Q8_0", **tiny_args)  # only its float checkpoint is used
    checkpoint = reference_dir(source)
    files = {}
    for outtype in dict.fromkeys([*outtypes, *(["bf16"] if presets else [])]):
        files[outtype.upper()] = convert(checkpoint, out_dir / f"real-{outtype.upper()}.gguf", outtype)
    for preset in presets:
        if not llama_quantize:
            raise ValueError("presets need --llama-quantize BIN")
        files[preset] = quantize(llama_quantize, files["BF16"], out_dir / f"real-{preset}.gguf", preset)
    for path in files.values():
        write_dequantized_reference(path, like=checkpoint)
    return files


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--outtypes", default="bf16,q8_0")
    p.add_argument("--presets", default="")
    p.add_argument("--llama-quantize", default=os.environ.get("LLAMA_QUANTIZE"))
    p.add_argument("--tiny-args", default="{}", help='make_tiny keyword arguments as JSON, e.g. {"heads": 16}')
    args = p.parse_args()
    files = make_real(Path(args.out), [t for t in args.outtypes.split(",") if t],
                      [t for t in args.presets.split(",") if t], args.llama_quantize, **json.loads(args.tiny_args))
    for name, path in files.items():
        print(name, path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
