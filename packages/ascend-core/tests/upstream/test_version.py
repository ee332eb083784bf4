from __future__ import annotations

import pytest

from ascend_core.upstream import installed_vllm_version, public_version, vllm_version_is


@pytest.mark.parametrize(
    ("installed", "target", "expected"),
    [
        ("0.27.1+empty", "0.27.1", True),
        ("0.27.1", "0.27.1", True),
        ("0.32.0+cpu", "0.32.0", True),
        ("0.27.1+empty", "0.27.2", False),
        ("0.33.1.dev12+gabc1234", "0.33.1", False),  # a main build is not the release
        ("0.33.1.dev12+gabc1234", "0.33.1.dev12", True),
        ("0.33.0", "0.33", True),  # PEP 440: trailing zeros are equal
    ],
)
def test_vllm_version_is(installed, target, expected):
    assert vllm_version_is(target, installed=installed) is expected


def test_installed_version_is_read_from_metadata():
    from ascend_core.upstream import ENGINE_TESTED

    installed = installed_vllm_version()
    assert installed in ENGINE_TESTED  # CI's two lanes: 0.32.0 (.venv) and 0.27.1 (.venv-release)
    assert vllm_version_is(installed) and not vllm_version_is("0.30.0")


def test_bad_version_names_the_string():
    with pytest.raises(ValueError, match="not-a-version"):
        public_version("not-a-version")
