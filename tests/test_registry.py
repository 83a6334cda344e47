"""The patch registry: claiming under the lock, applying outside it, undoing slots."""
from __future__ import annotations

import pytest


def test_a_patch_is_applied_outside_the_registry_lock():
    """Registry.apply holds its lock only to claim a patch: a check that waits on another thread which applies a
    different patch finishes (it would deadlock if the check ran under the lock)."""
    import threading
    import types

    from glm5_shim.registry import APPLIED, Patch, Registry

    registry = Registry()
    inner = registry.add(Patch("inner", "m", (), "", check=lambda m: None, apply=lambda m, p: None))

    def check_waiting_on_another_thread(module):
        worker = threading.Thread(target=registry.apply, args=(inner, module))
        worker.start()
        worker.join(timeout=10)
        assert not worker.is_alive(), "the other thread could not take the registry lock"

    outer = registry.add(Patch("outer", "m", (), "", check=check_waiting_on_another_thread, apply=lambda m, p: None))
    registry.apply(outer, types.ModuleType("m"))
    assert (outer.state, inner.state) == (APPLIED, APPLIED), (outer.as_dict(), inner.as_dict())


def test_replace_item_and_undo_restore_a_slot():
    from glm5_shim.registry import Patch

    patch = Patch("p", "m", (), "", check=lambda m: None, apply=lambda m, p: None)
    slots = {"taken": "vllm's"}
    patch.replace_item(slots, "empty", "ours")
    patch.replace_item(slots, "taken", "ours", set_with=slots.__setitem__)
    assert slots == {"taken": "ours", "empty": "ours"}
    patch.undo()
    assert slots == {"taken": "vllm's"}


def _premise(x):
    return helper_global(x) + 1  # noqa: F821  (a name looked up at call time)


def test_source_and_name_checks_name_what_they_looked_for():
    """The helpers every patch checks vLLM's source text and global lookups with: the text back when every fragment
    is there, else one refusal naming the place, the missing fragment and why it matters."""
    from glm5_shim.registry import TargetMismatch, require_names, require_source

    assert "helper_global(x) + 1" in require_source(_premise, "m._premise", "helper_global(", "+ 1")
    with pytest.raises(TargetMismatch) as err:
        require_source(_premise, "m._premise", "helper_global(", "residual=None", why="it runs from a fresh residual")
    assert str(err.value) == "m._premise no longer contains 'residual=None' (it runs from a fresh residual)"
    with pytest.raises(TargetMismatch, match="m.builtin: cannot read its source"):
        require_source(len, "m.builtin")
    require_names(_premise, "m._premise", "helper_global")
    with pytest.raises(TargetMismatch) as err:
        require_names(_premise, "m._premise", "helper_global", "other_global")
    assert str(err.value) == "m._premise no longer uses the name 'other_global'"
    with pytest.raises(TargetMismatch, match="m.builtin is not a Python function"):
        require_names(len, "m.builtin", "x")
