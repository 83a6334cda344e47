"""Activation in real interpreters: sitecustomize, lazy hooks, GLM5_SHIM=0, spawn children, broken targets,
the version guard and a shadowed sitecustomize.  Each case runs in a fresh Python with the repo on PYTHONPATH."""
from __future__ import annotations

import pathlib

from tests.helpers import declared_patch_names, last_json, run_python, script

STATUS = """
import importlib, json, sys
import vllm.engine.arg_utils
from glm5_shim.registry import REGISTRY
from glm5_shim import activation
unimportable = []
for patch in list(REGISTRY.patches()):
    try:
        importlib.import_module(patch.target)
    except ImportError:  # vllm.platforms.cuda needs the CUDA driver
        unimportable.append(patch.target)
print(json.dumps({"state": activation.state(), "by": activation.activated_by(), "unimportable": unimportable,
                  "patches": {p["name"]: [p["state"], p["reason"]] for p in REGISTRY.status()},
                  "targets": {p["name"]: p["target"] for p in REGISTRY.status()}}))
"""


def _all_applied(out) -> bool:
    """Every patch whose target could be imported here is applied; only CUDA-only targets may be missing."""
    assert set(out["unimportable"]) <= {"vllm.platforms.cuda"}, out["unimportable"]
    return all(state == "applied" or out["targets"][name] in out["unimportable"]
               for name, (state, _) in out["patches"].items())


def test_startup_imports_nothing_heavy():
    out = last_json(run_python("""
        import json, sys
        from glm5_shim import activation
        print(json.dumps({"heavy": [m for m in ("vllm", "torch", "triton", "wrapt", "gguf") if m in sys.modules],
                          "state": activation.state()}))
    """))
    assert out == {"heavy": [], "state": "waiting-for-vllm"}


def test_importing_vllm_applies_every_patch():
    out = last_json(run_python(STATUS))
    assert out["state"] == "active" and out["by"] == ["sitecustomize"]
    assert set(out["patches"]) == declared_patch_names(), "the registry differs from the declared patches"
    assert _all_applied(out), out["patches"]


def test_patched_callables_are_replacements_and_disabled_means_originals():
    probe = """
        import json
        import vllm.engine.arg_utils as au, vllm.transformers_utils.config as tc, vllm.config.model as cm
        from vllm.model_executor.layers.quantization.gguf import GGUFConfig
        objs = {"arg_utils": au.maybe_override_with_speculators, "config": tc.maybe_override_with_speculators,
                "dtype": cm._get_and_verify_dtype, "gate": GGUFConfig.get_supported_act_dtypes}
        print(json.dumps({k: [getattr(f, "__glm5_shim_patch__", None), f.__module__] for k, f in objs.items()}))
    """
    patched = last_json(run_python(probe))
    assert patched["arg_utils"][0] == patched["config"][0] == "speculators"
    assert patched["dtype"][0] == "dtype-auto" and patched["gate"][0] == "dtype-gate"
    stock = last_json(run_python(probe, {"GLM5_SHIM": "0"}))
    assert all(marker is None and module.startswith("vllm.") for marker, module in stock.values()), stock


def test_shim_disabled_registers_nothing():
    out = last_json(run_python("""
        import json, sys
        import vllm.engine.arg_utils
        from glm5_shim import activation
        from glm5_shim.registry import REGISTRY
        print(json.dumps({"state": activation.state(), "patches": len(REGISTRY.patches()),
                          "wrapt": "wrapt.importer" in sys.modules and any(
                              type(f).__module__.startswith("wrapt") for f in sys.meta_path)}))
    """, {"GLM5_SHIM": "0"}))
    assert out == {"state": "disabled", "patches": 0, "wrapt": False}


def test_spawned_child_is_patched_too():
    out = last_json(run_python("""
        import json, multiprocessing as mp

        def probe(q):
            import vllm.engine.arg_utils as au
            q.put(getattr(au.maybe_override_with_speculators, "__glm5_shim_patch__", None))

        if __name__ == "__main__":
            ctx = mp.get_context("spawn")
            q = ctx.Queue()
            p = ctx.Process(target=probe, args=(q,))
            p.start(); marker = q.get(timeout=240); p.join()
            print(json.dumps({"marker": marker, "exitcode": p.exitcode}))
    """))
    assert out == {"marker": "speculators", "exitcode": 0}


def test_broken_target_is_reported_not_fatal():
    proc = run_python(script("""
        import json, wrapt
        # Simulate a vLLM whose target changed shape: this hook runs before the shim's (registered first).
        def break_it(mod):
            mod.maybe_override_with_speculators = lambda only_one_arg: None
        wrapt.register_post_import_hook(break_it, "vllm.engine.arg_utils")
    """, STATUS))
    out = last_json(proc)
    state, reason = out["patches"]["speculators"]
    assert state == "not applied" and "expected parameters" in reason
    assert out["patches"]["dtype-auto"][0] == "applied"
    warnings = [l for l in proc.stderr.splitlines() if l.startswith("glm5-shim: WARNING")]
    assert len(warnings) == 1 and "speculators" in warnings[0]


def test_version_guard_refuses_other_vllm_and_force_overrides():
    fake = """
        import glm5_shim.activation as act
        act.installed_vllm_version = lambda: "0.24.1"
    """
    proc = run_python(script(fake, STATUS))
    out = last_json(proc)
    assert out["state"] == "refused"
    assert all(s == "not applied" and "0.24.1" in r for s, r in out["patches"].values())
    warnings = [l for l in proc.stderr.splitlines() if l.startswith("glm5-shim: WARNING")]
    assert len(warnings) == 1 and "vLLM 0.24.1" in warnings[0]
    forced = last_json(run_python(script(fake, STATUS), {"GLM5_SHIM_FORCE": "1"}))
    assert forced["state"] == "active"
    assert _all_applied(forced), forced["patches"]


def test_activation_is_idempotent_across_routes():
    out = last_json(run_python("""
        import json, glm5_shim
        import vllm.engine.arg_utils as au
        first = au.maybe_override_with_speculators
        glm5_shim.activate_from_vllm_plugin(); glm5_shim.activate("again")
        from glm5_shim.registry import REGISTRY
        patch = REGISTRY.get("speculators")
        REGISTRY.apply(patch, au)          # a second application must be a no-op
        patch.state = "not yet imported"; REGISTRY.apply(patch, au)   # even if the record forgot it
        inner = au.maybe_override_with_speculators.__wrapped__
        print(json.dumps({"same": au.maybe_override_with_speculators is first,
                          "inner_is_vllm": inner.__module__ == "vllm.transformers_utils.config",
                          "inner_marker": getattr(inner, "__glm5_shim_patch__", None)}))
    """))
    assert out == {"same": True, "inner_is_vllm": True, "inner_marker": None}


def test_shadowed_sitecustomize_still_runs(tmp_path: pathlib.Path):
    other = tmp_path / "other_site"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import builtins\nbuiltins.OTHER_SITECUSTOMIZE_RAN = True\n")
    out = last_json(run_python("""
        import builtins, json
        from glm5_shim import activation
        print(json.dumps({"other": getattr(builtins, "OTHER_SITECUSTOMIZE_RAN", False), "state": activation.state()}))
    """, pythonpath=[str(other)]))
    assert out == {"other": True, "state": "waiting-for-vllm"}


def test_broken_shim_never_stops_python(tmp_path: pathlib.Path):
    # A sitecustomize that raises stands in for a broken other one; python must still run, with one warning line.
    other = tmp_path / "broken_site"
    other.mkdir()
    (other / "sitecustomize.py").write_text("raise RuntimeError('boom')\n")
    proc = run_python("print('alive')", pythonpath=[str(other)])
    assert proc.returncode == 0 and proc.stdout.strip() == "alive"
    warnings = [l for l in proc.stderr.splitlines() if l.startswith("glm5-shim: WARNING")]
    assert len(warnings) == 1 and "boom" in warnings[0]
