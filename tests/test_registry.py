"""The patch registry: claiming under the lock, applying outside it, undoing slots."""
from __future__ import annotations


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
