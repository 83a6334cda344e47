"""GGUF header walking without gguf.GGUFReader: the architecture of a file cheaply, and the bounds-checked cursor the
reader uses to explain files GGUFReader cannot parse.

vLLM asks "what is this file?" many times per process (config, tokenizer, generation config ...); a real GLM-5
GGUF header holds a 154,880-token vocabulary that takes seconds to parse, while `general.architecture` is the first
key llama.cpp writes.
"""
from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any, BinaryIO

GGUF_MAGIC = b"GGUF"
# GGUF value types: 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 7 bool, 8 string, 9 array, 10 u64, 11 i64, 12 f64
SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY, UINT32 = 8, 9, 4
_MAX_KEYS_SCANNED = 64


class ShortRead(Exception):
    """The header runs past the end of the file (or holds a type the walker does not know)."""


class HeaderCursor:
    """Reads a GGUF header field by field from an open file, checking every length against the file size first,
    so a cut-off or corrupt header is described precisely and never makes us read a huge bogus length."""

    def __init__(self, handle: BinaryIO):
        self.handle = handle
        self.size = os.fstat(handle.fileno()).st_size
        self.offset = handle.tell()

    def take(self, n: int, what: str) -> bytes:
        end = self.offset + n
        if end > self.size:
            raise ShortRead(f"header field {what} needs bytes {self.offset}..{end}")
        chunk = self.handle.read(n)
        self.offset = end
        return chunk

    def skip(self, n: int, what: str) -> None:
        end = self.offset + n
        if end > self.size:
            raise ShortRead(f"header field {what} needs bytes {self.offset}..{end}")
        self.handle.seek(n, os.SEEK_CUR)
        self.offset = end

    def u32(self, what: str) -> int:
        return struct.unpack("<I", self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack("<Q", self.take(8, what))[0]

    def string(self, what: str) -> str:
        length = self.u64(what)
        return self.take(length, what).decode("utf-8", errors="replace")

    def skip_value(self, value_type: int, what: str) -> Any:
        """Step over one metadata value; returns it for strings and uint32 (what callers look at), else None."""
        if value_type == STRING:
            return self.string(what)
        if value_type == ARRAY:
            item_type = self.u32(what)
            n = self.u64(what)
            if item_type == STRING:
                for _ in range(n):
                    self.skip(self.u64(what), what)
            elif item_type in SCALAR_SIZES:
                self.skip(SCALAR_SIZES[item_type] * n, what)
            else:
                raise ShortRead(f"header field {what} has unknown array item type {item_type}")
            return None
        if value_type not in SCALAR_SIZES:
            raise ShortRead(f"header field {what} has unknown value type {value_type}")
        raw = self.take(SCALAR_SIZES[value_type], what)
        return int.from_bytes(raw, "little") if value_type == UINT32 else None


def is_gguf_file(path: str | os.PathLike) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def gguf_scalar_keys(path: str | os.PathLike, wanted: set[str]) -> dict[str, Any]:
    """The string / uint32 values of the `wanted` keys among a local GGUF's first entries ({} when unreadable).
    Never raises."""
    found: dict[str, Any] = {}
    try:
        with open(path, "rb") as f:
            cursor = HeaderCursor(f)
            if cursor.take(4, "magic") != GGUF_MAGIC or cursor.u32("version") < 2:
                return {}
            cursor.u64("tensor_count")
            kv_count = cursor.u64("kv_count")
            for i in range(min(kv_count, _MAX_KEYS_SCANNED)):
                key = cursor.string(f"key #{i}")
                value = cursor.skip_value(cursor.u32(key), key)
                if key in wanted and value is not None:
                    found[key] = value
                    if len(found) == len(wanted):
                        break
    except (OSError, ShortRead, struct.error):
        pass
    return found


def context_length(path: str | os.PathLike) -> int | None:
    """`<arch>.context_length` of a local GGUF (None when unreadable or absent).  launch.sh caps its default
    --max-model-len with it: vLLM refuses a max-model-len above the model's context."""
    arch = gguf_architecture(path)
    if arch is None:
        return None
    value = gguf_scalar_keys(path, {f"{arch}.context_length"}).get(f"{arch}.context_length")
    return value if isinstance(value, int) else None


def gguf_architecture(path: str | os.PathLike) -> str | None:
    """`general.architecture` of a local GGUF file, or None when it is not a readable GGUF or the key is absent
    from the first entries.  Never raises."""
    if not Path(path).is_file():
        return None
    arch = gguf_scalar_keys(path, {"general.architecture"}).get("general.architecture")
    return arch if isinstance(arch, str) else None
