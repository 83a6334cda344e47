"""GPU tests prove they ran compiled kernels.

A module that sets ``COMPILED_KERNELS`` (kernel names) gets, for every test that passes, the check that at least
one of those kernels was launched from a compiled binary during the test: Triton calls its launch hook only for
compiled launches, never in the interpreter.  ``@pytest.mark.compiled_kernels("name", ...)`` names other kernels
for one test.  ``compiled_launches`` gives a test the list itself.
"""
import pytest

from tests.conftest import INTERPRETING, _has_gpu

if _has_gpu() and INTERPRETING:
    raise pytest.UsageError("tests/gpu compiles kernels for the GPU: run it without TRITON_INTERPRET")

if _has_gpu():
    # GLM5_SHIM_CONSUMER_PTX=89|86|80: every kernel these tests compile is that consumer target's code, assembled for
    # this GPU, planned as on an RTX PRO 6000 / RTX 3090 (issue #52); each test then proves its kernels were those
    from glm5_shim.kernels.consumer import install_from_settings

    CONSUMER_PTX = install_from_settings()
else:
    CONSUMER_PTX = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.call_passed = report.passed


@pytest.fixture
def compiled_launches():
    from triton import knobs

    names: list[str] = []

    def record(launch_metadata):
        names.append(launch_metadata.get()["name"])

    knobs.runtime.launch_enter_hook.add(record)
    try:
        yield names
    finally:
        knobs.runtime.launch_enter_hook.remove(record)


@pytest.fixture(autouse=True)
def _proves_compiled_kernels(request):
    marker = request.node.get_closest_marker("compiled_kernels")
    expected = tuple(marker.args) if marker else getattr(request.module, "COMPILED_KERNELS", ())
    if not expected or not _has_gpu():
        yield
        return
    launches = request.getfixturevalue("compiled_launches")
    yield
    if getattr(request.node, "call_passed", False):
        ran = sorted(set(launches))
        assert set(ran) & set(expected), (
            f"{request.node.nodeid}: none of {expected} was launched from a compiled binary (launched: {ran})")
        if CONSUMER_PTX is not None:
            from glm5_shim.kernels.consumer import launched

            loaded = {c.name: c for c in launched()}
            wrong = [(n, loaded[n].ptx_target) for n in ran if n in loaded and loaded[n].ptx_target != CONSUMER_PTX]
            missing = [n for n in ran if n not in loaded]
            assert not wrong and not missing, (
                f"{request.node.nodeid}: kernels not from sm_{CONSUMER_PTX} PTX: {wrong}; not loaded through the "
                f"consumer path: {missing}")
