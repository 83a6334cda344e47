"""`pip install` alone (no PYTHONPATH, no sitecustomize): vLLM's general-plugin entry point activates the shim."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from importlib import metadata


def test_entry_point_is_registered():
    eps = [ep for ep in metadata.entry_points(group="vllm.general_plugins") if ep.name == "glm5_shim"]
    assert eps, "glm5-shim is not installed: the README's commands run `pip install -e .` first"
    assert eps[0].value == "glm5_shim:activate_from_vllm_plugin"


def test_vllm_plugin_loading_activates_the_shim_without_pythonpath():
    code = """
import json, sys
from vllm.plugins import load_general_plugins
load_general_plugins()
import vllm.engine.arg_utils as au
from glm5_shim import activation
print(json.dumps({"by": activation.activated_by(), "state": activation.state(),
                  "marker": getattr(au.maybe_override_with_speculators, "__glm5_shim_patch__", None),
                  "sitecustomize": "_glm5_shim_shadowed_sitecustomize" in sys.modules}))
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("GLM5_SHIM")}
    env["VLLM_LOGGING_LEVEL"] = "ERROR"
    with tempfile.TemporaryDirectory() as cwd:  # not the repo: glm5_shim must come from the installed package
        proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True,
                              timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"by": ["vllm-plugin"], "state": "active", "marker": "speculators", "sitecustomize": False}
