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
