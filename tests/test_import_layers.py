"""The import picture (docs/layout.md): every import inside glm5_shim goes to a lower floor, so there is no circle
and no upward arrow.  Read from the source (every import statement, at module level or inside a function), not from
what a run happens to import."""
import ast
import pathlib

import pytest

# floor of each part of the package: a part imports only parts on lower floors
FLOORS = {
    "names": 0, "settings": 0,
    "gguf": 1, "registry": 1,
    "kernels": 2,
    "kernels.gguf": 3,
    "attention": 4, "loading": 4, "matmul": 4, "report": 4,
    "patches": 5, "preflight": 5,
    "activation": 6,
    "doctor": 7,
    "cli": 8,
    "__main__": 9, "glm5_shim": 9,
    "glm5_shim.__version__": 0,  # the root package's one constant (its functions import activation when called)
}
ROOT = pathlib.Path(__file__).resolve().parents[1] / "glm5_shim"


def _part(module: str) -> str:
    parts = module.split(".")[1:]
    if parts[:2] == ["kernels", "gguf"]:
        return "kernels.gguf"
    return parts[0] if parts else "glm5_shim"


def _is_part(name: str) -> bool:
    leaf = name.split(".")[-1]
    return (ROOT / leaf).is_dir() or (ROOT / f"{leaf}.py").is_file()


def _module_name(path: pathlib.Path) -> tuple[str, str]:
    """(module, package its relative imports resolve in)"""
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
        return ".".join(parts), ".".join(parts)
    return ".".join(parts), ".".join(parts[:-1])


def _imports(path: pathlib.Path):
    module, package = _module_name(path)
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [f"{target}.{a.name}" for a in node.names]
            yield node.lineno, target, names
        elif isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name, []


def _edges():
    for path in sorted(ROOT.rglob("*.py")):
        module, _ = _module_name(path)
        src = _part(module)
        for line, target, names in _imports(path):
            if not target.startswith("glm5_shim"):
                continue
            # `from glm5_shim import report` names the part in the imported name; `__version__` is the root's own
            dsts = ({_part(target)} if target != "glm5_shim" else
                    {_part(n) if _is_part(n) else n for n in names})
            for d in dsts:
                if d != src:
                    yield path.relative_to(ROOT.parent), line, src, d


def test_every_part_has_a_floor():
    parts = {_part(_module_name(p)[0]) for p in ROOT.rglob("*.py")}
    assert parts <= set(FLOORS), f"parts without a floor in FLOORS: {sorted(parts - set(FLOORS))}"


def test_imports_only_go_down():
    upward = [f"{path}:{line}: {src} (floor {FLOORS[src]}) imports {dst} (floor {FLOORS.get(dst)})"
              for path, line, src, dst in _edges() if FLOORS.get(dst, 99) >= FLOORS[src]]
    assert not upward, "\n".join(upward)


@pytest.mark.parametrize("pure", ["gguf", "kernels.gguf.traits", "kernels.gguf.routing"])
def test_pure_parts_import_neither_torch_nor_vllm(pure):
    """gguf/ (facts about files) and the GGUF kernels' traits and routing are read by doctor, inspect and launch.sh's
    preflight, which must not pay for torch, Triton or vLLM at import."""
    base = ROOT.joinpath(*pure.split("."))
    paths = sorted(base.rglob("*.py")) if base.is_dir() else [base.with_suffix(".py")]
    heavy = []
    for path in paths:
        tree = ast.parse(path.read_text())
        for node in tree.body:  # module level only: functions may import what they need
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                heavy += [f"{path.relative_to(ROOT.parent)}:{node.lineno}: {n}" for n in names
                          if n.split(".")[0] in ("torch", "triton", "vllm")]
    assert not heavy, heavy
