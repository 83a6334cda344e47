"""Tiny glm-dsa GGUF fixtures, generated once per test session into a temporary directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from glm5_shim.gguf.fixture import QUANT_TYPES, make_tiny, reference_dir

# Small indexer for fixtures that only need a well-formed file (keeps bad-input cases fast).
SMALL = dict(layers=2, index_heads=4)


class TinyModel:
    """A generated GGUF plus the reference it was made from."""

    def __init__(self, paths: list[Path]):
        self.paths = paths
        self.path = paths[0]
        self.reference = reference_dir(self._logical_path())
        self._weights: dict[str, np.ndarray] | None = None

    def _logical_path(self) -> Path:
        # Shards are named stem-0000k-of-0000N.gguf; the reference sits next to the requested stem.gguf.
        name = self.path.name
        if "-00001-of-" in name:
            name = name.split("-00001-of-")[0] + ".gguf"
        return self.path.with_name(name)

    @property
    def config(self) -> dict[str, Any]:
        return json.loads((self.reference / "config.json").read_text())

    @property
    def weights(self) -> dict[str, np.ndarray]:
        if self._weights is None:
            from safetensors.numpy import load_file
            self._weights = load_file(str(self.reference / "model.safetensors"))
        return self._weights


@pytest.fixture(scope="session")
def gguf_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("gguf-fixtures")


@pytest.fixture(scope="session")
def tiny(gguf_dir) -> Callable[..., TinyModel]:
    """tiny(name, **make_tiny_kwargs) → TinyModel, generated on first use and cached for the session."""
    cache: dict[str, TinyModel] = {}

    def get(name: str, **kwargs) -> TinyModel:
        if name not in cache:
            cache[name] = TinyModel(make_tiny(gguf_dir / f"{name}.gguf", **kwargs))
        return cache[name]

    return get


@pytest.fixture(scope="session")
def tiny_by_quant(tiny) -> Callable[[str], TinyModel]:
    """The default tiny model (3 layers + MTP, seed 0) for each quant type."""
    def get(quant: str) -> TinyModel:
        assert quant in QUANT_TYPES
        return tiny(f"tiny-{quant}", quant=quant)
    return get


@pytest.fixture(scope="session")
def q8(tiny_by_quant) -> TinyModel:
    return tiny_by_quant("Q8_0")


@pytest.fixture(scope="session")
def small(tiny) -> Callable[..., TinyModel]:
    """small(name, **overrides): a 2-layer model with a 4-head indexer (for bad-input cases)."""
    def get(name: str, **kwargs) -> TinyModel:
        return tiny(f"small-{name}", **{**SMALL, **kwargs})
    return get
