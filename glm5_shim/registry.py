"""Patch records and their status.  No vLLM import here: a patch names its target module as a string.

A patch module under glm5_shim/patches/ declares one or more :class:`Patch` objects.  Each says which module
triggers it, what it replaces, how to check that the target still has the shape the replacement was written for,
and how to apply it.  The registry applies a patch at most once, records originals so it can be undone (tests),
and never lets a failure escape into the import that triggered it.
"""
from __future__ import annotations

import inspect
import threading
from dataclasses import dataclass, field
from enum import StrEnum
from types import ModuleType
from typing import Any, Callable

from glm5_shim.settings import warn as _warn



class PatchState(StrEnum):
    """Where a patch stands; the values are what doctor prints."""
    WAITING = "not yet imported"
    APPLYING = "applying"
    APPLIED = "applied"
    NOT_APPLIED = "not applied"


WAITING, APPLYING, APPLIED, NOT_APPLIED = (PatchState.WAITING, PatchState.APPLYING, PatchState.APPLIED,
                                           PatchState.NOT_APPLIED)

MARKER = "__glm5_shim_patch__"


class TargetMismatch(Exception):
    """The target no longer looks like the code the patch was written for."""


@dataclass
class Patch:
    name: str
    target: str  # module whose import triggers the patch
    replaces: tuple[str, ...]  # "module:attr" or "module:Class.attr", for humans and doctor
    summary: str
    check: Callable[[ModuleType], None]  # raises TargetMismatch(reason)
    apply: Callable[[ModuleType, "Patch"], None]
    state: PatchState = WAITING
    reason: str = ""
    _originals: list[tuple[Any, str, Any]] = field(default_factory=list, repr=False)

    # -- helpers used by apply() ---------------------------------------------------------------------------
    def replace(self, owner: Any, attr: str, new: Any) -> Any:
        """Set owner.attr = new, remembering the original; a second call for an already patched attr is a no-op."""
        current = inspect.getattr_static(owner, attr)
        if getattr(_unwrap_descriptor(current), MARKER, None) == self.name:
            return getattr(_unwrap_descriptor(current), "__wrapped__", None)
        func = _unwrap_descriptor(new)
        original = _unwrap_descriptor(current)
        setattr(func, MARKER, self.name)
        setattr(func, "__wrapped__", original)
        if getattr(func, "__doc__", None) is None and getattr(original, "__doc__", None):
            try:
                func.__doc__ = original.__doc__  # help() on the patched callable reads as vLLM's
            except (AttributeError, TypeError):
                pass
        self._originals.append((owner, attr, current))
        setattr(owner, attr, new)
        return original

    def replace_item(self, mapping: dict, key: Any, value: Any, set_with: Callable[[Any, Any], None] | None = None):
        """mapping[key] = value (through set_with(key, value) when the owner has its own setter), remembering the slot's
        previous value (or its absence) for undo."""
        self._originals.append((mapping, key, mapping.get(key)))
        if set_with is None:
            mapping[key] = value
        else:
            set_with(key, value)

    def undo(self) -> None:
        for owner, attr, original in reversed(self._originals):
            if isinstance(owner, dict):  # a slot set by replace_item
                if original is None:
                    owner.pop(attr, None)
                else:
                    owner[attr] = original
            else:
                setattr(owner, attr, original)
        self._originals.clear()
        if self.state == APPLIED:
            self.state, self.reason = WAITING, "undone"

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "target": self.target, "replaces": list(self.replaces),
                "summary": self.summary, "state": self.state.value, "reason": self.reason}


def _unwrap_descriptor(obj: Any) -> Any:
    return obj.__func__ if isinstance(obj, (staticmethod, classmethod)) else obj


def require(condition: bool, reason: str) -> None:
    if not condition:
        raise TargetMismatch(reason)


def require_attr(owner: Any, attr: str, where: str) -> Any:
    if not hasattr(owner, attr):
        raise TargetMismatch(f"{where} has no attribute {attr!r}")
    return getattr(owner, attr)


def require_source(obj: Any, where: str, *fragments: str, why: str = "") -> str:
    """The source text of `obj` (a vLLM function or class), refused where it lacks one of `fragments`: the text a
    patch's premise rests on.  The refusal names `where` and the first fragment missing."""
    try:
        source = inspect.getsource(obj)
    except (OSError, TypeError) as exc:
        raise TargetMismatch(f"{where}: cannot read its source ({exc})") from None
    for fragment in fragments:
        if fragment not in source:
            raise TargetMismatch(f"{where} no longer contains {fragment!r}" + (f" ({why})" if why else ""))
    return source


def require_names(func: Any, where: str, *names: str, why: str = "") -> None:
    """`func` must use each of `names` as a global or attribute name (its code object's co_names): the module globals
    a patch replaces are only reached if vLLM's function looks them up there."""
    code = getattr(func, "__code__", None)
    if code is None:
        raise TargetMismatch(f"{where} is not a Python function")
    for name in names:
        if name not in code.co_names:
            raise TargetMismatch(f"{where} no longer uses the name {name!r}" + (f" ({why})" if why else ""))


def require_params(func: Any, expected: tuple[str, ...], where: str) -> None:
    """The first parameters of func must be `expected`, in order."""
    try:
        params = tuple(inspect.signature(func).parameters)
    except (TypeError, ValueError) as exc:
        raise TargetMismatch(f"{where}: cannot read signature ({exc})") from None
    if params[: len(expected)] != expected:
        raise TargetMismatch(f"{where}: expected parameters {expected}, found {params}")


class Registry:
    def __init__(self) -> None:
        self._patches: dict[str, Patch] = {}
        self._lock = threading.RLock()
        self.refusal: str = ""  # set when the version guard refuses the whole installation

    def add(self, patch: Patch) -> Patch:
        with self._lock:
            existing = self._patches.get(patch.name)
            if existing is not None:
                return existing
            self._patches[patch.name] = patch
            return patch

    def get(self, name: str) -> Patch:
        return self._patches[name]

    def patches(self) -> list[Patch]:
        return list(self._patches.values())

    def refuse_all(self, reason: str) -> None:
        with self._lock:
            self.refusal = reason
            for patch in self._patches.values():
                if patch.state == WAITING:
                    patch.state, patch.reason = NOT_APPLIED, reason

    def apply(self, patch: Patch, module: ModuleType) -> None:
        """Check and apply one patch against its freshly imported target.  Never raises.

        The lock only claims the patch: the check and the replacement run outside it, because they may import modules
        whose own hooks apply other patches, possibly on another thread (wrapt calls hooks outside its lock too)."""
        with self._lock:
            if patch.state in (APPLIED, APPLYING) or self.refusal:
                return
            patch.state = APPLYING
        state, reason = APPLIED, ""
        try:
            patch.check(module)
        except TargetMismatch as exc:
            state, reason = NOT_APPLIED, f"target check failed: {exc}"
            _warn(f"patch {patch.name!r} not applied: {exc}")
        except Exception as exc:  # a check that crashes is a mismatch too
            state, reason = NOT_APPLIED, f"target check crashed: {type(exc).__name__}: {exc}"
            _warn(f"patch {patch.name!r} not applied: check crashed: {type(exc).__name__}: {exc}")
        else:
            try:
                patch.apply(module, patch)
            except Exception as exc:
                patch.undo()
                state, reason = NOT_APPLIED, f"apply failed: {type(exc).__name__}: {exc}"
                _warn(f"patch {patch.name!r} failed while applying: {type(exc).__name__}: {exc}")
        with self._lock:
            patch.state, patch.reason = state, reason

    def status(self) -> list[dict[str, Any]]:
        return [p.as_dict() for p in self._patches.values()]

    def undo_all(self) -> None:
        with self._lock:
            for patch in self._patches.values():
                patch.undo()


REGISTRY = Registry()
