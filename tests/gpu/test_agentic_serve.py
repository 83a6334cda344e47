"""#18 on a GPU: the results of `python bench/agentic.py run --out DIR` (AGENTIC_RESULTS=DIR): a scripted tiny GLM-5
GGUF served through launch.sh with --reasoning-parser glm45 --tool-call-parser glm47 --enable-auto-tool-choice."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

RESULTS = os.environ.get("AGENTIC_RESULTS")
pytestmark = pytest.mark.skipif(not RESULTS, reason="AGENTIC_RESULTS names no bench/agentic.py output directory")

EXPECTED = [f"/tokenize = Jinja ({conv}, enable_thinking {label})" for label in ("unset", "true", "false")
            for conv in ("user", "tool round trip")] + \
    [f"chat, {label}, {mode}" for label in ("thinking", "enable_thinking false") for mode in ("non-streaming",
                                                                                             "streaming")]


@pytest.fixture(scope="module")
def checks():
    data = json.loads((Path(RESULTS) / "agentic.json").read_text())
    return {c["name"]: c for c in data["checks"]}


def test_every_check_ran(checks):
    assert "run" not in checks, checks.get("run")
    assert sorted(checks) == sorted(EXPECTED)


@pytest.mark.parametrize("name", EXPECTED)
def test_check_passed(checks, name):
    assert checks[name]["ok"], checks[name]["detail"]
