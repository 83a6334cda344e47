"""Open a GGUF model (one file or a set of `*-0000k-of-0000N.gguf` shards) and check it is readable.

Only headers are parsed here; tensor data stays memory-mapped and is never touched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import gguf
import numpy as np

from glm5_shim.names import GGUF_ARCH

from .errors import GGUFError
from .probe import GGUF_MAGIC, HeaderCursor, ShortRead

GLM_DSA_ARCH = GGUF_ARCH
SHARD_NAME_RE = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
SPLIT_NO = gguf.Keys.Split.LLM_KV_SPLIT_NO
SPLIT_COUNT = gguf.Keys.Split.LLM_KV_SPLIT_COUNT
SPLIT_TENSORS_COUNT = gguf.Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT


def shard_file_name(stem: str, number: int, count: int) -> str:
    """llama.cpp's shard naming: number is 1-based."""
    return f"{stem}-{number:05d}-of-{count:05d}.gguf"


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the model: its gguf ReaderTensor and the shard that holds it."""

    name: str
    reader_tensor: Any  # gguf.ReaderTensor
    shard: int  # 0-based index into GGUFModel.paths
    path: Path

    @property
    def ggml_type(self) -> gguf.GGMLQuantizationType:
        return self.reader_tensor.tensor_type

    @property
    def type_name(self) -> str:
        return self.reader_tensor.tensor_type.name

    @property
    def shape(self) -> tuple[int, ...]:
        """Logical shape in numpy order (the reverse of GGUF's ne order)."""
        return tuple(int(d) for d in reversed(self.reader_tensor.shape.tolist()))

    @property
    def ne(self) -> tuple[int, ...]:
        """Shape in GGUF ne order (fastest-varying dimension first)."""
        return tuple(int(d) for d in self.reader_tensor.shape.tolist())

    @property
    def n_elements(self) -> int:
        return int(self.reader_tensor.n_elements)

    @property
    def n_bytes(self) -> int:
        return int(self.reader_tensor.n_bytes)

    @property
    def data(self) -> np.ndarray:
        """The memory-mapped raw data (uint8 byte-shape for quantized and BF16 tensors)."""
        return self.reader_tensor.data


class GGUFModel:
    """A GGUF model split over one or more files, with merged metadata and a name → tensor index."""

    def __init__(self, paths: list[Path], readers: list[Any], metadata: dict[str, Any],
                 tensors: dict[str, TensorInfo]):
        self.paths = paths
        self.readers = readers
        self.metadata = metadata
        self.tensors = tensors

    @property
    def path(self) -> Path:
        """The first (or only) file."""
        return self.paths[0]

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    @property
    def file_size(self) -> int:
        return sum(p.stat().st_size for p in self.paths)

    def shared_data(self) -> tuple[int, int]:
        """(tensors whose bytes are another tensor's — the same shard and offset, as make-slice --shared-data writes;
        bytes of all tensors): a file whose tensors point at one copy loads as the sum of them all."""
        seen: set[tuple[int, int]] = set()
        shared = 0
        for info in self:
            offset = getattr(info.reader_tensor, "data_offset", None)  # (a model built in memory has none)
            if offset is None:
                continue
            where = (info.shard, int(offset))
            shared += where in seen
            seen.add(where)
        return shared, sum(info.n_bytes for info in self)

    def arch_key(self, suffix: str) -> str:
        """`attention.head_count` → `glm-dsa.attention.head_count`."""
        return f"{self.architecture}.{suffix}"

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def __contains__(self, tensor_name: str) -> bool:
        return tensor_name in self.tensors

    def __iter__(self) -> Iterator[TensorInfo]:
        return iter(self.tensors.values())

    def __repr__(self) -> str:
        return (f"GGUFModel({str(self.path)!r}, arch={self.architecture!r}, shards={len(self.paths)}, "
                f"tensors={len(self.tensors)})")


def shard_paths(path: str | Path) -> list[Path]:
    """All files of the model that `path` belongs to, in order; raises GGUFError naming a missing shard."""
    path = Path(path)
    match = SHARD_NAME_RE.match(path.name)
    if not match:
        return [path]
    count = int(match["count"])
    number = int(match["no"])
    if count < 1 or not 1 <= number <= count:
        raise GGUFError(f"{path}: shard name says shard {number} of {count}, expected 1 <= shard <= count")
    paths = [path.with_name(shard_file_name(match["stem"], i, count)) for i in range(1, count + 1)]
    for i, shard in enumerate(paths, start=1):
        if not shard.is_file():
            raise GGUFError(f"{path}: missing shard {i} of {count}: expected file {shard} which does not exist")
    return paths


def _field_value(field: Any) -> Any:
    value = field.contents()
    if isinstance(value, np.generic):
        value = value.item()
    return value


def _check_magic(path: Path) -> None:
    if not path.is_file():
        raise GGUFError(f"{path}: file not found")
    size = path.stat().st_size
    with open(path, "rb") as handle:
        magic = handle.read(4)
    if magic != GGUF_MAGIC:
        raise GGUFError(f"{path}: not a GGUF file: expected magic {GGUF_MAGIC!r} at byte 0, found {magic!r} "
                        f"(file size {size} bytes)")


def _open_reader(path: Path) -> Any:
    _check_magic(path)
    try:
        # read-only and shared: a copy-on-write map would be charged against the commit limit at its whole size (a
        # 400 GB file per rank), which Linux can refuse; the loader's views of it are only read (vLLM narrows and
        # copies them)
        reader = gguf.GGUFReader(path)
    except (ValueError, IndexError, KeyError, OverflowError, UnicodeDecodeError, TypeError) as exc:
        raise GGUFError(_diagnose_unreadable(path, exc)) from None
    size = path.stat().st_size
    for tensor in reader.tensors:
        end = int(tensor.data_offset) + int(tensor.n_bytes)
        if end > size:
            raise GGUFError(f"{path}: truncated file: tensor {tensor.name} needs bytes "
                            f"{tensor.data_offset}..{end} but the file has {size} bytes")
    return reader


def open_gguf(path: str | Path, expected_architecture: str | None = GLM_DSA_ARCH) -> GGUFModel:
    """Open a GGUF file, or all shards of a split model given any one of them (normally the first).

    Checks the magic, that every header parses, that no tensor's data runs past its file's end, that
    `split.*` keys agree with the file names and with each other, and (unless `expected_architecture`
    is None) `general.architecture`. Every problem is a one-line GGUFError.
    """
    paths = shard_paths(path)
    readers = [_open_reader(p) for p in paths]
    first = paths[0]

    shard_metadata = [
        {name: _field_value(field) for name, field in reader.fields.items() if not name.startswith("GGUF.")}
        for reader in readers
    ]
    _check_split_keys(paths, shard_metadata, [len(r.tensors) for r in readers])

    metadata = dict(shard_metadata[0])
    for p, shard_meta in zip(paths[1:], shard_metadata[1:]):
        for key, value in shard_meta.items():
            if key.startswith("split."):
                continue
            if key in metadata and metadata[key] != value:
                raise GGUFError(f"{p}: metadata key {key} is {_short(value)} but the first shard {first.name} "
                                f"has {_short(metadata[key])}")
            metadata.setdefault(key, value)

    if "general.architecture" not in metadata:
        raise GGUFError(f"{first}: metadata key general.architecture is missing")
    arch = metadata["general.architecture"]
    if expected_architecture is not None and arch != expected_architecture:
        raise GGUFError(f"{first}: metadata key general.architecture is {arch!r}, expected {expected_architecture!r}")

    tensors: dict[str, TensorInfo] = {}
    for shard, (p, reader) in enumerate(zip(paths, readers)):
        for tensor in reader.tensors:
            if tensor.name in tensors:
                other = tensors[tensor.name].path.name
                raise GGUFError(f"{p}: tensor {tensor.name} appears twice (also in {other})")
            tensors[tensor.name] = TensorInfo(tensor.name, tensor, shard, p)
    return GGUFModel(paths, readers, metadata, tensors)


def _check_split_keys(paths: list[Path], shard_metadata: list[dict], tensor_counts: list[int]) -> None:
    count = len(paths)
    first = paths[0]
    if count == 1:
        declared = shard_metadata[0].get(SPLIT_COUNT, 1)
        if declared != 1:
            raise GGUFError(f"{first}: metadata key {SPLIT_COUNT} is {declared}, expected 1 for a file not named "
                            f"<stem>-0000k-of-0000N.gguf (rename the shards or open the first shard)")
        return
    for i, (p, meta) in enumerate(zip(paths, shard_metadata)):
        if meta.get(SPLIT_COUNT) != count:
            raise GGUFError(f"{p}: metadata key {SPLIT_COUNT} is {meta.get(SPLIT_COUNT)}, expected {count} "
                            f"(from the file name)")
        if meta.get(SPLIT_NO) != i:
            raise GGUFError(f"{p}: metadata key {SPLIT_NO} is {meta.get(SPLIT_NO)}, expected {i} (from the file name)")
    declared_total = shard_metadata[0].get(SPLIT_TENSORS_COUNT)
    total = sum(tensor_counts)
    if declared_total is not None and declared_total != total:
        raise GGUFError(f"{first}: metadata key {SPLIT_TENSORS_COUNT} is {declared_total} but the {count} shards "
                        f"hold {total} tensors")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# --- diagnosis of files that gguf.GGUFReader cannot parse -------------------------------------------------


def _diagnose_unreadable(path: Path, exc: Exception) -> str:
    """Explain why gguf.GGUFReader failed: a header or tensor cut off by truncation, or corrupt data."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        cursor = HeaderCursor(handle)
        try:
            cursor.take(4, "magic")
            version = cursor.u32("version")
            if version not in (2, 3):
                return f"{path}: unsupported GGUF version {version}, expected 2 or 3"
            n_tensors = cursor.u64("tensor_count")
            n_kv = cursor.u64("kv_count")
            alignment = gguf.GGUF_DEFAULT_ALIGNMENT
            for i in range(n_kv):
                key = cursor.string(f"key #{i}")
                value_type = cursor.u32(key)
                value = cursor.skip_value(value_type, key)
                if key == "general.alignment" and value:
                    alignment = value
            infos = []
            for i in range(n_tensors):
                name = cursor.string(f"tensor info #{i}")
                n_dims = cursor.u32(name)
                dims = [cursor.u64(name) for _ in range(n_dims)]
                type_id = cursor.u32(name)
                offset = cursor.u64(name)
                try:
                    ggml_type = gguf.GGMLQuantizationType(type_id)
                except ValueError:
                    return f"{path}: tensor {name}: unknown GGML type id {type_id}"
                block, type_size = gguf.GGML_QUANT_SIZES[ggml_type]
                infos.append((name, offset, int(np.prod(dims, dtype=np.int64)) // block * type_size))
        except ShortRead as short:
            return f"{path}: truncated file: {short} but the file has {size} bytes"
    data_start = -(-cursor.offset // alignment) * alignment
    for name, offset, n_bytes in infos:
        end = data_start + offset + n_bytes
        if end > size:
            return (f"{path}: truncated file: tensor {name} needs bytes {data_start + offset}..{end} "
                    f"but the file has {size} bytes")
    return f"{path}: corrupt GGUF header: gguf.GGUFReader failed with {type(exc).__name__}: {exc}"
