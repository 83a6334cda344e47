"""One record per GGML type the shim's GGUF kernels read: its block, its grid, its packed layout, which kernels
compute it.  Every per-type list of the kernels, the routing and the loader is derived from this table (adding a
type: one record here, its decode math in the kernels).  Pure: imports only the gguf package.

What the plans *choose* for a type (thresholds, measured) is :mod:`glm5_shim.kernels.gguf.routing`'s; what vLLM's
own kernels do with it is :mod:`glm5_shim.gguf.dequant`'s and the routing's ``VLLM_*`` facts.
"""
from __future__ import annotations

from dataclasses import dataclass

import gguf

_T = gguf.GGMLQuantizationType


@dataclass(frozen=True)
class GGMLTraits:
    name: str
    block_values: int        # values a block holds (gguf.GGML_QUANT_SIZES)
    block_bytes: int         # bytes a block takes in the file
    grid: bool = False       # decoded through a lattice grid (gguf.quants' table, held on the device as bytes)
    register_mma: bool = False  # the register-MMA (Gluon) decode kernels compute it (tiles.py computes them all)
    packed_layout: bool = False  # register_mma.pack has a 16-byte-aligned layout for it
    packs_at_load: bool = False  # serving repacks it at load (loading/gguf_repack.py; measured faster)

    @property
    def id(self) -> int:
        return int(_T[self.name])


def _traits(name: str, **facts) -> GGMLTraits:
    values, nbytes = gguf.GGML_QUANT_SIZES[_T[name]]
    return GGMLTraits(name, values, nbytes, **facts)


# In the order GLM-5 files use them most (Q4_K_M: Q4_K experts, Q6_K down / lm_head; Q8_0; Q5_K in _M mixes; then
# the low-bit mixes and the UD-IQ files' types): the order every derived list keeps.
TRAITS: tuple[GGMLTraits, ...] = (
    _traits("Q4_K", register_mma=True),
    _traits("Q6_K", register_mma=True, packed_layout=True, packs_at_load=True),
    _traits("Q5_K", register_mma=True),
    _traits("Q8_0", register_mma=True, packed_layout=True, packs_at_load=True),
    _traits("Q2_K", register_mma=True),
    _traits("Q3_K"),
    _traits("IQ4_XS"),
    _traits("IQ4_NL"),
    _traits("IQ2_XXS", grid=True, register_mma=True, packed_layout=True, packs_at_load=True),
    _traits("IQ2_S", grid=True, register_mma=True, packed_layout=True, packs_at_load=True),
    _traits("IQ3_XXS", grid=True, register_mma=True),
    _traits("IQ3_S", grid=True, register_mma=True),
    _traits("IQ2_XS", grid=True),
    _traits("IQ1_S", grid=True),
    _traits("IQ1_M", grid=True),
    _traits("Q5_0"),
    _traits("Q4_0"),
    _traits("Q4_1"),
    _traits("Q5_1"),
)
BY_ID: dict[int, GGMLTraits] = {t.id: t for t in TRAITS}


def traits_of(qtype: int) -> GGMLTraits:
    try:
        return BY_ID[int(qtype)]
    except KeyError:
        raise ValueError(f"GGUF type {int(qtype)} ({_T(int(qtype)).name}) is not read by the shim's kernels "
                         f"(those: {', '.join(t.name for t in TRAITS)})") from None


def ids(**facts) -> tuple[int, ...]:
    """The type ids whose records have every given fact, in TRAITS' order: ids(grid=True), ids(register_mma=True)."""
    return tuple(t.id for t in TRAITS if all(getattr(t, k) == v for k, v in facts.items()))


def block_bytes(qtype: int) -> tuple[int, int]:
    """(values, bytes) of one block of ``qtype`` (any GGML type, as gguf.GGML_QUANT_SIZES has it)."""
    return gguf.GGML_QUANT_SIZES[_T(int(qtype))]


# the type ids as names the kernels' constexpr branches read (QTYPE == Q4_K)
Q4_K, Q6_K, Q5_K, Q8_0, Q2_K, Q3_K = (int(_T[n]) for n in ("Q4_K", "Q6_K", "Q5_K", "Q8_0", "Q2_K", "Q3_K"))
IQ4_XS, IQ4_NL, IQ2_XXS, IQ2_S, IQ3_XXS, IQ3_S = (int(_T[n]) for n in ("IQ4_XS", "IQ4_NL", "IQ2_XXS", "IQ2_S",
                                                                       "IQ3_XXS", "IQ3_S"))
IQ2_XS, IQ1_S, IQ1_M, Q5_0, Q4_0, Q4_1, Q5_1 = (int(_T[n]) for n in ("IQ2_XS", "IQ1_S", "IQ1_M", "Q5_0", "Q4_0",
                                                                     "Q4_1", "Q5_1"))

TILE_TYPES = ids()                            # every type the tile kernels read (tiles.py)
REGISTER_MMA_TYPES = ids(register_mma=True)   # what the register-MMA kernels compute (register_mma.py)
GRID_TYPES = ids(grid=True)                   # whose launches take a grid table
PACKED_LAYOUT_TYPES = ids(packed_layout=True)  # register_mma.PACKERS' keys
LOAD_PACKED_TYPES = ids(packs_at_load=True)   # repacked at load by serving
