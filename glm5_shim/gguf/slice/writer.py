"""make_slice: write a GLM-5 slice (plan.plan_slice) as one GGUF, streaming tensor by tensor.

The header (metadata, tensor infos) is written first from the plan; then each tensor's bytes go out in chunks of
random valid blocks (blocks.RandomBlocks), so memory stays at the block pool (256 MiB) whatever the file's size.
A --shared-data plan's tensors that share another's bytes get that tensor's offset and no bytes of their own
(SharedDataWriter); `write_plain_copy` writes such a file again with every tensor's bytes in order, for readers that
take only that (llama.cpp's gguf.cpp wants each tensor's offset right after the previous one's data).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import gguf
import numpy as np

from ..fixture.metadata import ARCH, _insert_after, apply_metadata_overrides, glm_dsa_metadata
from ..fixture.model_config import GLM5_SIZES
from ..fixture.tensor_types import file_type_of
from .blocks import RandomBlocks
from .plan import TOKENIZER_PRE, SlicePlan, SliceTensor, plan_slice

# The slice's own metadata keys (besides general.name and general.description).
KEY_PREFIX = "glm5_shim.slice."


@dataclass(frozen=True)
class SliceResult:
    path: Path
    plan: SlicePlan
    nbytes: int  # tensor data written
    seconds: float  # writing the tensor data (generating included)
    generate_seconds: float  # of which making the blocks

    @property
    def gb_per_s(self) -> float:
        return self.nbytes / self.seconds / 1e9 if self.seconds else float("inf")

    @property
    def generate_gb_per_s(self) -> float:
        return self.nbytes / self.generate_seconds / 1e9 if self.generate_seconds else float("inf")

    def summary(self) -> str:
        shared = (f" (shared data: {self.plan.nbytes / 1e9:.2f} GB of tensors, layers "
                  f"{', '.join(map(str, self.plan.distinct_layers))} own theirs)") if self.plan.shared_data else ""
        return (f"{self.path}: {len(self.plan.tensors)} tensors{shared}, {self.nbytes / 1e9:.2f} GB of tensor data "
                f"written in "
                f"{self.seconds:.1f} s ({self.gb_per_s:.2f} GB/s; making the blocks alone "
                f"{self.generate_gb_per_s:.2f} GB/s)")


class SharedDataWriter(gguf.GGUFWriter):
    """gguf-py's writer, with the tensor-info offsets of a --shared-data plan (data_offsets, at the writer's own
    alignment) instead of one after another: tensors may point at the same bytes."""

    def __init__(self, path, arch: str, plan: SlicePlan):
        super().__init__(path, arch)
        self.plan = plan

    def write_ti_data_to_file(self) -> None:
        assert self.fout is not None and len(self.fout) == 1, "one file, no splits"
        self.offsets = data_offsets(self.plan, self.data_alignment)
        infos = bytearray()
        for name, ti in self.tensors[0].items():
            infos += self._pack_val(name, gguf.GGUFValueType.STRING, add_vtype=False)
            infos += self._pack("I", len(ti.shape))
            for dim in reversed(ti.shape):
                infos += self._pack("Q", dim)
            infos += self._pack("I", ti.dtype)
            infos += self._pack("Q", self.offsets[name])
        self.fout[0].write(infos)
        self.fout[0].flush()
        self.state = gguf.gguf_writer.WriterState.TI_DATA


def data_offsets(plan: SlicePlan, alignment: int) -> dict[str, int]:
    """Each tensor's offset in the data section: owners of their bytes one after another in plan order (each padded
    to `alignment`), sharers at their owner's offset."""
    offsets: dict[str, int] = {}
    cursor = 0
    for t in plan.tensors:
        if not t.data_of:
            offsets[t.name] = cursor
            cursor += -(-t.nbytes // alignment) * alignment
    for t in plan.tensors:
        if t.data_of:
            offsets[t.name] = offsets[t.data_of]
    return offsets


def describe(plan: SlicePlan) -> str:
    c = plan.config
    n = c["num_hidden_layers"]
    mtp = f" + the MTP block blk.{n}" if c["num_nextn_predict_layers"] else ""
    rank = (f"; the model ONE tensor-parallel rank of {plan.rank_of} computes in vLLM 0.23 (heads, dense/shared/expert "
            f"FFN widths and vocabulary divided by {plan.rank_of}; q_a/kv_a, the DSA indexer, the router and the "
            f"norms whole)") if plan.rank_of > 1 else ""
    shared = (f"; tensor data shared: the layers of one kind point at one copy (layers "
              f"{', '.join(map(str, plan.distinct_layers))} own theirs; a loader reads every layer's full bytes)"
              ) if plan.shared_data else ""
    return (f"GLM-5 slice with random weights (glm5-shim make-slice): {n} of GLM-5's "
            f"{GLM5_SIZES['num_hidden_layers']} layers at full size, the first {c['first_k_dense_replace']} dense"
            f"{mtp}, {plan.preset} types{rank}{shared}")


def slice_metadata(plan: SlicePlan, seed: int) -> dict[str, tuple]:
    """The converter's glm-dsa metadata for the slice's config and tokenizer, named and described as a slice."""
    V = gguf.GGUFValueType
    metadata = glm_dsa_metadata(plan.config, plan.tokenizer, file_type_of(plan.preset, plan.preset), TOKENIZER_PRE)
    name = f"GLM-5 slice {plan.config['num_hidden_layers']}L {plan.preset}" + (
        f" rank-of-{plan.rank_of}" if plan.rank_of > 1 else "")
    metadata["general.name"] = (name, V.STRING)
    metadata = _insert_after(metadata, "general.name", "general.description", (describe(plan), V.STRING))
    apply_metadata_overrides(metadata, {
        KEY_PREFIX + "layers": plan.config["num_hidden_layers"],
        KEY_PREFIX + "dense_layers": plan.config["first_k_dense_replace"],
        KEY_PREFIX + "mtp": bool(plan.config["num_nextn_predict_layers"]),
        KEY_PREFIX + "preset": plan.preset,
        KEY_PREFIX + "tp_rank_of": plan.rank_of,
        KEY_PREFIX + "order": plan.order,
        KEY_PREFIX + "seed": seed,
        KEY_PREFIX + "peaked": plan.peaked,
        **({KEY_PREFIX + "shared_data": True} if plan.shared_data else {}),
    })
    return metadata


def write_plan(out_path: str | Path, plan: SlicePlan, *, seed: int = 0,
               progress: Callable[[str], None] | None = None, blocks: RandomBlocks | None = None,
               data: Callable[[SliceTensor], Iterator[np.ndarray]] | None = None) -> SliceResult:
    """Write `plan` to `out_path` (one file), streaming; `progress(line)` is called once a tensor. `data(tensor)`, when
    given, yields each tensor's bytes instead of random blocks (write_plain_copy)."""
    out_path = Path(out_path)
    if out_path.suffix != ".gguf":
        raise ValueError(f"{out_path}: expected a path ending in .gguf")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    blocks = blocks or RandomBlocks(seed)

    writer = SharedDataWriter(out_path, ARCH, plan) if plan.shared_data else gguf.GGUFWriter(out_path, ARCH)
    for t in plan.tensors:
        writer.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes,
                               raw_dtype=gguf.GGMLQuantizationType[t.type_name])
    metadata = slice_metadata(plan, seed)
    size_label = gguf.size_label(*writer.get_total_parameter_count()[:3], plan.config["n_routed_experts"])
    metadata = _insert_after(metadata, "general.name", "general.size_label", (size_label, gguf.GGUFValueType.STRING))
    for key, (value, vtype) in metadata.items():
        if key == "general.architecture":
            writer.kv_data[0].pop(key, None)  # the writer set it already; replace without a warning
        writer.add_key_value(key, value, vtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    fout = writer.fout[0]
    writer.write_padding(fout, fout.tell())

    written = 0
    generating = 0.0
    start = time.perf_counter()
    try:
        for i, t in enumerate(plan.tensors):
            if t.data_of:
                continue
            n = 0
            if data is not None:
                chunks = data(t)
            elif t.pass_through:
                chunks = blocks.pass_through_chunks(t.type_name, t.shape, t.pass_through)
            else:
                chunks = blocks.chunks(t.type_name, t.n_values, t.std, t.mean)
            while True:
                t0 = time.perf_counter()
                chunk = next(chunks, None)
                generating += time.perf_counter() - t0
                if chunk is None:
                    break
                fout.write(memoryview(chunk))
                n += chunk.nbytes
            if n != t.nbytes:
                raise AssertionError(f"{t.name}: wrote {n} bytes, expected {t.nbytes}")
            writer.write_padding(fout, n)
            written += n
            if progress is not None:
                progress(f"[{i + 1}/{len(plan.tensors)}] {t.name} {t.type_name} {list(t.shape)} "
                         f"{n / 1e6:.1f} MB")
        fout.flush()
    finally:
        writer.close()
    return SliceResult(out_path, plan, written, time.perf_counter() - start, generating)


def make_slice(out_path: str | Path, layers: int, dense_layers: int, preset: str, *, mtp: bool = False,
               rank_of: int = 1, order: str = "auto", seed: int = 0, peaked: bool = False, shared_data: bool = False,
               progress: Callable[[str], None] | None = None) -> SliceResult:
    """Write a random-weight GLM-5 slice (see plan.plan_slice) to `out_path`; returns what was written and how fast."""
    plan = plan_slice(layers, dense_layers, preset, mtp=mtp, rank_of=rank_of, order=order, peaked=peaked,
                      shared_data=shared_data)
    return write_plan(out_path, plan, seed=seed, progress=progress)


def slice_info(result: SliceResult) -> dict[str, Any]:
    return {"path": str(result.path), "tensors": len(result.plan.tensors), "bytes": result.nbytes,
            "seconds": round(result.seconds, 3), "gb_per_s": round(result.gb_per_s, 3),
            "generate_gb_per_s": round(result.generate_gb_per_s, 3)}


def slice_arguments(reader: gguf.GGUFReader, path: str | Path) -> dict[str, Any]:
    """make-slice's arguments, read back from the slice's own metadata keys (KEY_PREFIX) in `reader` (of `path`)."""
    keys = {"layers": "layers", "dense_layers": "dense_layers", "mtp": "mtp", "preset": "preset",
            "tp_rank_of": "rank_of", "order": "order", "seed": "seed", "peaked": "peaked", "shared_data": "shared_data"}
    out: dict[str, Any] = {"shared_data": False, "peaked": False}
    for key, arg in keys.items():
        field = reader.get_field(KEY_PREFIX + key)
        if field is not None:
            out[arg] = field.contents()
    missing = [k for k in ("layers", "dense_layers", "mtp", "preset", "rank_of", "order", "seed") if k not in out]
    if missing:
        raise ValueError(f"{path}: not a make-slice file (no {', '.join(KEY_PREFIX + k for k in missing)})")
    return out


def write_plain_copy(src_path: str | Path, out_path: str | Path, *,
                     progress: Callable[[str], None] | None = None) -> SliceResult:
    """The slice at `src_path` (a --shared-data one, typically) written again with every tensor's own bytes, one
    after another: the same tensors, bytes and metadata as make-slice writes for the same arguments without
    --shared-data, and the bytes are copied from `src_path` (so the two files are one model)."""
    reader = gguf.GGUFReader(src_path)
    args = slice_arguments(reader, src_path)
    seed = args.pop("seed")
    args["shared_data"] = False
    plan = plan_slice(args.pop("layers"), args.pop("dense_layers"), args.pop("preset"), **args)
    found = {t.name: t for t in reader.tensors}
    for t in plan.tensors:
        have = found.get(t.name)
        if have is None or have.tensor_type.name != t.type_name or int(have.n_bytes) != t.nbytes:
            what = "missing" if have is None else f"{have.tensor_type.name}, {int(have.n_bytes)} bytes"
            raise ValueError(f"{src_path}: tensor {t.name}: expected {t.type_name}, {t.nbytes} bytes (its slice "
                             f"metadata's plan), found {what}")
    if len(found) != len(plan.tensors):
        extra = sorted(set(found) - {t.name for t in plan.tensors})
        raise ValueError(f"{src_path}: tensors its slice metadata does not plan: {', '.join(extra[:5])}")

    def data(t: SliceTensor) -> Iterator[np.ndarray]:
        raw = np.asarray(found[t.name].data).reshape(-1).view(np.uint8)
        for start in range(0, raw.size, 64 << 20):
            yield raw[start:start + (64 << 20)]

    return write_plan(out_path, plan, seed=seed, progress=progress, data=data)
