"""Cheap GGUF probing: the architecture from the first few metadata entries, without parsing the whole header.

vLLM asks "what is this file?" many times per process (config, tokenizer, generation config ...); a real GLM-5
GGUF header holds a 154,880-token vocabulary that takes seconds to parse, while `general.architecture` is the first
key llama.cpp writes.
"""
from __future__ import annotations

import os
import struct
from pathlib import Path

_MAGIC = b"GGUF"
# GGUF value types: 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 7 bool, 8 string, 9 array, 10 u64, 11 i64, 12 f64
_SCALAR_SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_MAX_KEYS_SCANNED = 64


def is_gguf_file(path: str | os.PathLike) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == _MAGIC
    except OSError:
        return False


def gguf_architecture(path: str | os.PathLike) -> str | None:
    """`general.architecture` of a local GGUF file, or None when it is not a readable GGUF or the key is absent
    from the first entries.  Never raises."""
    try:
        if not Path(path).is_file():
            return None
        with open(path, "rb") as f:
            return _scan(f)
    except (OSError, struct.error, UnicodeDecodeError, ValueError):
        return None


def _scan(f) -> str | None:
    if f.read(4) != _MAGIC:
        return None
    (version,) = struct.unpack("<I", f.read(4))
    if version < 2:
        return None
    _tensor_count, kv_count = struct.unpack("<QQ", f.read(16))
    for _ in range(min(kv_count, _MAX_KEYS_SCANNED)):
        key = _read_string(f)
        (vtype,) = struct.unpack("<I", f.read(4))
        if key == "general.architecture" and vtype == 8:
            return _read_string(f)
        _skip_value(f, vtype)
    return None


def _read_string(f) -> str:
    (n,) = struct.unpack("<Q", f.read(8))
    if n > 1 << 20:
        raise ValueError("implausible string length")
    return f.read(n).decode("utf-8")


def _skip_value(f, vtype: int) -> None:
    if vtype in _SCALAR_SIZE:
        f.seek(_SCALAR_SIZE[vtype], os.SEEK_CUR)
    elif vtype == 8:
        (n,) = struct.unpack("<Q", f.read(8))
        f.seek(n, os.SEEK_CUR)
    elif vtype == 9:
        item_type, count = struct.unpack("<IQ", f.read(12))
        if item_type in _SCALAR_SIZE:
            f.seek(_SCALAR_SIZE[item_type] * count, os.SEEK_CUR)
        elif item_type == 8:
            for _ in range(count):
                (n,) = struct.unpack("<Q", f.read(8))
                f.seek(n, os.SEEK_CUR)
        else:
            raise ValueError(f"unsupported nested array type {item_type}")
    else:
        raise ValueError(f"unknown GGUF value type {vtype}")
