"""A Hugging Face tokenizer directory rebuilt from a GGUF, cached on disk and shared by every vLLM process.

The directory is keyed by the GGUF's path, size and modification time and written atomically (temporary
directory, then rename), so concurrent processes never see a half-written tokenizer.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path


def cache_root() -> Path:
    base = os.environ.get("GLM5_SHIM_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "glm5_shim")
    return Path(base)


def tokenizer_dir_for(gguf_path: str | os.PathLike) -> Path:
    from glm5_shim.loading.hf_config import file_version

    version = file_version(gguf_path)
    path = Path(version[0])
    digest = hashlib.sha256("\0".join(map(str, version)).encode()).hexdigest()[:16]
    target = cache_root() / "tokenizers" / f"{path.stem}-{digest}"
    if (target / "tokenizer_config.json").is_file():
        return target
    from glm5_shim.gguf.tokenizer import save_tokenizer_dir

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        save_tokenizer_dir(path, tmp)
        try:
            os.rename(tmp, target)
        except OSError:  # another process won the race: its copy is identical
            if not (target / "tokenizer_config.json").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target
