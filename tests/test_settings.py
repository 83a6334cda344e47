"""The environment switches: defaults, accepted values, and a one-line error naming the variable otherwise."""
import pytest

from glm5_shim import settings


@pytest.mark.parametrize("name, reader", [("GLM5_SHIM_ATTENTION", settings.attention_choice),
                                          ("GLM5_SHIM_INDEXER", settings.indexer_choice)])
def test_choices(monkeypatch, name, reader):
    monkeypatch.delenv(name, raising=False)
    assert reader() == "auto"
    monkeypatch.setenv(name, " Triton ")
    assert reader() == "triton"
    monkeypatch.setenv(name, "flashmla")
    with pytest.raises(ValueError) as err:
        reader()
    assert str(err.value) == f"{name}='flashmla': expected one of auto, triton"


@pytest.mark.parametrize("value, enabled", [(None, True), ("", True), ("1", True), ("0", False), ("off", False),
                                            ("false", False)])
def test_master_switch(monkeypatch, value, enabled):
    if value is None:
        monkeypatch.delenv("GLM5_SHIM", raising=False)
    else:
        monkeypatch.setenv("GLM5_SHIM", value)
    assert settings.shim_enabled() is enabled


def test_every_switch_is_documented_in_the_readme(repo_root):
    readme = (repo_root / "README.md").read_text()
    for name in settings.ENV_SWITCHES:
        assert f"`{name}" in readme, name


def test_consumer_ptx_target(monkeypatch):
    """GLM5_SHIM_CONSUMER_PTX: unset means each GPU's own code; 89, 86 or 80 name the consumer target; anything else
    is a one-line error naming the variable (sm_120 PTX is newer than Hopper's ptxas takes)."""
    monkeypatch.delenv("GLM5_SHIM_CONSUMER_PTX", raising=False)
    assert settings.consumer_ptx_target() is None
    monkeypatch.setenv("GLM5_SHIM_CONSUMER_PTX", " 80 ")
    assert settings.consumer_ptx_target() == 80
    monkeypatch.setenv("GLM5_SHIM_CONSUMER_PTX", "120")
    with pytest.raises(ValueError) as err:
        settings.consumer_ptx_target()
    assert str(err.value) == "GLM5_SHIM_CONSUMER_PTX='120': expected one of 89, 86, 80"
