"""Every testkit module imports: a helper removed from one module must not leave another importing it."""

import importlib
import pkgutil

import pytest

import ascend_testkit

MODULES = sorted(m.name for m in pkgutil.walk_packages(ascend_testkit.__path__, "ascend_testkit."))


@pytest.mark.parametrize("name", MODULES)
def test_module_imports(name):
    importlib.import_module(name)
