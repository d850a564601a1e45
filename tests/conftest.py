"""Shared fixtures: the tiny synthetic model is built once per session (it is cheap, but every test uses it)."""

import pytest

from pdlib.weights import load_model


@pytest.fixture(scope="session")
def tiny():
    return load_model("synthetic:tiny@0")
