"""Activation: decide whether to patch, then let wrapt patch vLLM lazily, module by module.

Start-up cost matters (this runs in every Python process that has the repo on PYTHONPATH), so activate() imports
nothing heavy: it puts a tiny finder on sys.meta_path that waits for the first ``vllm`` import.  Only then are the
version guard, the patch declarations and wrapt loaded, and wrapt post-import hooks registered for each patch's
target module.  vLLM itself is never imported by the shim before the application imports it.
"""
from __future__ import annotations

import sys
import threading

from glm5_shim import settings
from glm5_shim.settings import warn as _warn

_lock = threading.RLock()
_state = "inactive"  # inactive | waiting-for-vllm | active | disabled | refused
_activated_by: list[str] = []


class _VllmImportTrigger:
    """A meta-path finder that never finds anything; it only notices that vLLM is being imported."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "vllm" or fullname.startswith("vllm."):
            _remove_trigger()
            _on_vllm_import()
        return None

    def invalidate_caches(self):  # importlib calls this on every finder
        pass


_trigger = _VllmImportTrigger()


def _remove_trigger() -> None:
    try:
        sys.meta_path.remove(_trigger)
    except ValueError:
        pass


def activate(source: str = "api") -> str:
    """Turn the shim on in this process; idempotent, safe from any number of routes.  Returns the state."""
    global _state
    with _lock:
        _activated_by.append(source)
        if _state != "inactive":
            return _state
        if not settings.shim_enabled():
            _state = "disabled"
            return _state
        if "vllm" in sys.modules:  # plugin route, or vLLM imported before us: hooks fire at once
            _on_vllm_import()
        else:
            _state = "waiting-for-vllm"
            sys.meta_path.insert(0, _trigger)
        return _state


def installed_vllm_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


def vllm_version_supported(version: str | None) -> bool:
    if version is None:
        return False
    parts = version.split(".")
    return ".".join(parts[:2]) == settings.SUPPORTED_VLLM


def _on_vllm_import() -> None:
    global _state
    with _lock:
        if _state in ("active", "refused"):
            return
        try:
            from glm5_shim.patches import load_all
            from glm5_shim.registry import REGISTRY

            load_all(REGISTRY)
            version = installed_vllm_version()
            if not vllm_version_supported(version) and not settings.force_unsupported_vllm():
                reason = (f"vLLM {version} is installed; glm5-shim supports vLLM {settings.SUPPORTED_VLLM}.x only "
                          f"(pip install vllm==0.23.0, or GLM5_SHIM_FORCE=1 to patch anyway)")
                REGISTRY.refuse_all(reason)
                _state = "refused"
                _warn(f"nothing patched: {reason}")
                return
            import wrapt

            for patch in REGISTRY.patches():
                wrapt.register_post_import_hook(_hook_for(patch), patch.target)
            _state = "active"
            if settings.consumer_ptx_target() is not None:  # testing consumer-GPU code on Hopper only
                from glm5_shim.kernels.consumer import install_from_settings

                install_from_settings()
        except Exception as exc:  # the shim must never break the interpreter or vLLM's import
            _state = "refused"
            _warn(f"activation failed, vLLM stays stock: {type(exc).__name__}: {exc}")


def _hook_for(patch):
    def hook(module):
        from glm5_shim.registry import REGISTRY

        REGISTRY.apply(patch, module)

    return hook


def state() -> str:
    return _state


def activated_by() -> list[str]:
    return list(_activated_by)
