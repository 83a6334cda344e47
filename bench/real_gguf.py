"""GLM-5 GGUFs written by llama.cpp's own tools, not by the project's imitation of them.

    python bench/real_gguf.py OUT_DIR [--outtypes bf16,q8_0] [--presets Q4_K_M,IQ2_M] [--tiny-args JSON]
                                      [--build-tools | --llama-quantize BIN --llama-imatrix BIN]

1. `make_tiny` writes a tiny random GLM-5 and its HF checkpoint (`<stem>.reference/`);
2. llama.cpp's `convert_hf_to_gguf.py` (from the llama-cpp-python sdist, pinned below; downloaded once with pip into
   ~/.cache/glm5_shim) converts that checkpoint to `real-<outtype>.gguf`;
3. with `--llama-quantize BIN` (a build of llama.cpp's `llama-quantize`; `--build-tools` builds it and
   `llama-imatrix` from the same sdist, CPU, ~4 min on 2 cores, cached) each preset is quantized from the BF16 file
   to `real-<preset>.gguf`; the very low-bit presets (IQ1_S … IQ3_M) with an importance matrix `llama-imatrix`
   computes on the BF16 file, and the MTP layer kept at Q8_0 (the imatrix run never executes it);
4. every file gets `<stem>.reference/` holding what it stores decoded to float32 (a float32 reference model then
   differs from an engine running the file only by arithmetic).

The converter runs unmodified except for one runtime override: its tokenizer pre-type is recognised by a hash of a
known vocabulary, which a synthetic vocabulary cannot match, so the pre-type is given (GLM's is "glm4").
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
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


class _CacheLock:
    """An exclusive lock on a file beside `path` while the body runs: test processes running at once (pytest-xdist
    workers) download, unpack and build into the cache one at a time, and the later ones find the result."""

    def __init__(self, path: Path):
        self.path = path.with_name(path.name + ".lock")

    def __enter__(self):
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.handle = open(self.path, "w")
        fcntl.flock(self.handle, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        self.handle.close()


def llama_cpp_tree(cache: Path = CACHE) -> Path:
    """The vendored llama.cpp tree of the pinned llama-cpp-python sdist (downloaded and unpacked once)."""
    root = cache / f"llama-cpp-python-{LLAMA_CPP_PYTHON}"
    tree = root / f"llama_cpp_python-{LLAMA_CPP_PYTHON}" / "vendor" / "llama.cpp"
    if (tree / "convert_hf_to_gguf.py").is_file():
        return tree
    with _CacheLock(root):
        return _unpack_tree(root, tree)


def _unpack_tree(root: Path, tree: Path) -> Path:
    if (tree / "convert_hf_to_gguf.py").is_file():  # another process did it while this one waited
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


LLAMA_TOOLS = ("llama-quantize", "llama-imatrix")


def llama_cpp_source(cache: Path = CACHE) -> Path:
    """The whole vendored llama.cpp tree of the pinned sdist (what a C++ build needs; llama_cpp_tree() extracts only
    the converter's files)."""
    tree = llama_cpp_tree(cache)
    if not (tree / "tools" / "quantize" / "quantize.cpp").is_file():
        with _CacheLock(tree.parents[2]):
            if not (tree / "tools" / "quantize" / "quantize.cpp").is_file():
                sdist = tree.parents[2] / f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"
                with tarfile.open(sdist) as tar:
                    members = [m for m in tar.getmembers() if "/vendor/llama.cpp/" in m.name]
                    tar.extractall(tree.parents[2], members=members, filter="data")
    return tree


def llama_tools(cache: Path = CACHE, build: bool = False) -> dict[str, Path] | None:
    """llama.cpp's own llama-quantize and llama-imatrix (CPU build of the pinned sdist's tree, cached under
    `cache`): the binaries if built; with build=True built first when missing (~4 min on 2 cores), else None."""
    out = cache / f"llama-build-{LLAMA_CPP_PYTHON}"
    tools = {name: out / "bin" / name for name in LLAMA_TOOLS}
    if all(p.is_file() for p in tools.values()):
        return tools
    if not build:
        return None
    tree = llama_cpp_source(cache)
    with _CacheLock(out):
        if all(p.is_file() for p in tools.values()):  # built by another process while this one waited
            return tools
        return _build_tools(tree, out, tools)


def _build_tools(tree: Path, out: Path, tools: dict[str, Path]) -> dict[str, Path]:
    # portable code (the cache may outlive the CPU), no tests or examples, static: the two tools alone are built
    configure = ["cmake", "-S", str(tree), "-B", str(out), "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=OFF",
                 "-DGGML_CCACHE=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
                 "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_TOOLS=ON", "-DBUILD_SHARED_LIBS=OFF"]
    if shutil.which("ninja"):
        configure += ["-G", "Ninja"]
    for cmd in (configure, ["cmake", "--build", str(out), "--target", *LLAMA_TOOLS, "-j", str(os.cpu_count() or 2)]):
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"building llama.cpp's tools failed ({' '.join(cmd[:3])} ...):\n"
                               f"{(proc.stdout + proc.stderr)[-3000:]}")
    missing = [str(p) for p in tools.values() if not p.is_file()]
    if missing:
        raise RuntimeError(f"llama.cpp's build finished without {', '.join(missing)}")
    return tools


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


# presets llama-quantize refuses without an importance matrix (its very low-bit types), and the type most of
# their tensors get (the UD files' routed experts): a file's main type
IMATRIX_PRESETS = {"IQ1_S": "IQ1_S", "IQ1_M": "IQ1_M", "IQ2_XXS": "IQ2_XXS", "IQ2_XS": "IQ2_XS", "IQ2_M": "IQ2_S",
                   "IQ3_XXS": "IQ3_XXS", "IQ3_M": "IQ3_S"}


def quantize(binary: str, src: Path, out: Path, preset: str, imatrix: Path | None = None,
             extra: tuple[str, ...] = ()) -> Path:
    cmd = [binary, *(("--imatrix", str(imatrix)) if imatrix else ()), *extra, str(src), str(out), preset, "2"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not out.is_file():
        raise RuntimeError(f"llama-quantize {preset} failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    return out


def importance_matrix(binary: str, model: Path, out: Path) -> Path:
    """llama-imatrix over the tiny corpus (16 chunks of 128 tokens: every expert of the tiny model is routed to)."""
    from glm5_shim.gguf._tiny_corpus import TINY_CORPUS

    text = out.with_suffix(".txt")
    text.write_text((TINY_CORPUS + "\n") * 20)
    proc = subprocess.run([binary, "-m", str(model), "-f", str(text), "-o", str(out), "-c", "128", "--chunks", "16",
                           "-t", str(os.cpu_count() or 2)], capture_output=True, text=True)
    if proc.returncode != 0 or not out.is_file():
        raise RuntimeError(f"llama-imatrix failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    return out


def mtp_layers_at_q8_0(model: Path) -> tuple[str, ...]:
    """llama-quantize arguments keeping the MTP layers at Q8_0: llama.cpp's imatrix run never executes them, so a
    very low-bit preset has no importance data for them and refuses the file."""
    import gguf

    reader = gguf.GGUFReader(str(model))
    arch = reader.fields["general.architecture"].contents()
    blocks = int(reader.fields[f"{arch}.block_count"].contents())
    nextn = int(reader.fields[f"{arch}.nextn_predict_layers"].contents()) if \
        f"{arch}.nextn_predict_layers" in reader.fields else 0
    return tuple(a for layer in range(blocks - nextn, blocks) for a in ("--tensor-type", fr"blk\.{layer}\.=q8_0"))


def make_real(out_dir: Path, outtypes=("bf16", "q8_0"), presets=(), llama_quantize: str | None = None,
              llama_imatrix: str | None = None, **tiny_args) -> dict[str, Path]:
    """Write the tiny model's checkpoint and the real tools' GGUFs of it; returns name → GGUF path.  Presets of
    IMATRIX_PRESETS need llama_imatrix too: one importance matrix of the BF16 file serves them all."""
    from glm5_shim.gguf.fixture import make_tiny, reference_dir, write_dequantized_reference

    out_dir.mkdir(parents=True, exist_ok=True)
    source = out_dir / "source.gguf"
    make_tiny(source, quant="Q8_0", **tiny_args)  # only its float checkpoint is used
    checkpoint = reference_dir(source)
    files = {}
    for outtype in dict.fromkeys([*outtypes, *(["bf16"] if presets else [])]):
        files[outtype.upper()] = convert(checkpoint, out_dir / f"real-{outtype.upper()}.gguf", outtype)
    imatrix = None
    for preset in presets:
        if not llama_quantize:
            raise ValueError("presets need --llama-quantize BIN")
        extra = ()
        if preset in IMATRIX_PRESETS:
            if not llama_imatrix:
                raise ValueError(f"preset {preset} needs --llama-imatrix BIN (an importance matrix)")
            imatrix = imatrix or importance_matrix(llama_imatrix, files["BF16"], out_dir / "imatrix.gguf")
            extra = mtp_layers_at_q8_0(files["BF16"])
        files[preset] = quantize(llama_quantize, files["BF16"], out_dir / f"real-{preset}.gguf", preset,
                                 imatrix if preset in IMATRIX_PRESETS else None, extra)
    for path in files.values():
        write_dequantized_reference(path, like=checkpoint)
    return files


# Other architectures (issue #51: the shim is active in every vLLM process of its environment, whatever GGUF is
# served): transformers' own model classes at tiny random sizes, with widths that are multiples of 256 (K-quant rows)
# and widths that are not (llama-quantize falls back to Q5_0 / Q4_0 / Q8_0 there), GQA heads, and for the MoE other
# expert counts and widths than GLM-5's.
OTHER_ARCHS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=512, intermediate_size=1376, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
        head_dim=64, max_position_embeddings=2048, rms_norm_eps=1e-5, tie_word_embeddings=False)),
    "qwen3moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        hidden_size=256, intermediate_size=800, moe_intermediate_size=160, num_experts=8, num_experts_per_tok=2,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=2048,
        decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True, tie_word_embeddings=False)),
}
OTHER_OUTTYPES = ("bf16", "q8_0")
OTHER_PRESETS = ("Q4_K_M", "Q2_K")


def other_checkpoint(out_dir: Path, arch: str, seed: int = 0) -> Path:
    """A tiny random HF checkpoint of another architecture (OTHER_ARCHS) with the tiny GLM tokenizer's files: what
    llama.cpp's converter takes.  Weights: transformers' own initialisation (std 0.02), seeded."""
    import torch
    import transformers

    from glm5_shim.gguf.fixture import make_tiny, reference_dir

    config_class, model_class, sizes = OTHER_ARCHS[arch]
    out_dir.mkdir(parents=True, exist_ok=True)
    source = out_dir / "tokenizer-source.gguf"
    make_tiny(source, quant="Q8_0", layers=2, mtp=False, write_reference=True)
    tok_dir = reference_dir(source)
    checkpoint = out_dir / f"{arch}-hf"
    checkpoint.mkdir(exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tok_dir / name, checkpoint / name)
    tokenizer = json.loads((tok_dir / "tokenizer.json").read_text())
    vocab = len(tokenizer["model"]["vocab"]) + len(tokenizer.get("added_tokens", []))
    config = getattr(transformers, config_class)(vocab_size=vocab, torch_dtype="bfloat16", **sizes)
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(config).to(torch.bfloat16)
    model.save_pretrained(checkpoint, safe_serialization=True)
    return checkpoint


def make_other_real(out_dir: Path, arch: str, outtypes=OTHER_OUTTYPES, presets=(),
                    llama_quantize: str | None = None) -> dict[str, Path]:
    """llama.cpp's converter (and llama-quantize for `presets`) on a tiny checkpoint of `arch`; name → GGUF."""
    checkpoint = other_checkpoint(out_dir, arch)
    files = {}
    for outtype in dict.fromkeys([*outtypes, *(["bf16"] if presets else [])]):
        files[outtype.upper()] = convert(checkpoint, out_dir / f"{arch}-{outtype.upper()}.gguf", outtype)
    for preset in presets:
        if not llama_quantize:
            raise ValueError("presets need llama-quantize")
        files[preset] = quantize(llama_quantize, files["BF16"], out_dir / f"{arch}-{preset}.gguf", preset)
    return files


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--outtypes", default="bf16,q8_0")
    p.add_argument("--presets", default="")
    p.add_argument("--llama-quantize", default=os.environ.get("LLAMA_QUANTIZE"))
    p.add_argument("--llama-imatrix", default=os.environ.get("LLAMA_IMATRIX"))
    p.add_argument("--build-tools", action="store_true", help="build llama-quantize and llama-imatrix from the "
                   "pinned sdist (CPU, cached) and use them")
    p.add_argument("--tiny-args", default="{}", help='make_tiny keyword arguments as JSON, e.g. {"heads": 16}')
    args = p.parse_args()
    if args.build_tools:
        tools = llama_tools(build=True)
        args.llama_quantize, args.llama_imatrix = str(tools["llama-quantize"]), str(tools["llama-imatrix"])
    files = make_real(Path(args.out), [t for t in args.outtypes.split(",") if t],
                      [t for t in args.presets.split(",") if t], args.llama_quantize, args.llama_imatrix,
                      **json.loads(args.tiny_args))
    for name, path in files.items():
        print(name, path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
