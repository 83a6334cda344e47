"""Activates glm5_shim in every Python process started with this repository on PYTHONPATH.

It must stay cheap (no vLLM/torch/triton import here) and must never stop the interpreter: any failure is one
warning line.  It also runs the ``sitecustomize`` this file shadows (Debian, conda and others ship one).
"""


def _run_shadowed_sitecustomize():
    import importlib.machinery
    import importlib.util
    import os
    import sys

    here = os.path.dirname(os.path.realpath(__file__))
    others = [p for p in sys.path if os.path.realpath(p or os.getcwd()) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is None or spec.loader is None:
        return
    if spec.origin and os.path.realpath(spec.origin) == os.path.realpath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["_glm5_shim_shadowed_sitecustomize"] = module
    spec.loader.exec_module(module)


def _activate_glm5_shim():
    import glm5_shim

    glm5_shim.activate("sitecustomize")


for _step in (_run_shadowed_sitecustomize, _activate_glm5_shim):
    try:
        _step()
    except BaseException as _exc:  # noqa: BLE001 - a broken shim must not stop python
        try:
            import sys as _sys

            _sys.stderr.write(f"glm5-shim: WARNING: {_step.__name__.lstrip('_')} failed: "
                              f"{type(_exc).__name__}: {_exc}\n")
        except BaseException:
            pass
del _step
