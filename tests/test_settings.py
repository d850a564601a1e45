"""The PDLIB_* switches (pdlib/settings.py): one table names every switch the project reads, values are
read when asked for, and a bad one is refused by name."""

import re
from pathlib import Path

import pytest

from pdlib import settings
from pdlib.errors import InputError

ROOT = Path(__file__).parent.parent


def test_every_switch_the_project_reads_is_in_the_table():
    named = {
        m for p in (ROOT / "pdlib").rglob("*.py") for m in re.findall(r"\bPDLIB_[A-Z0-9_]*[A-Z0-9]\b", p.read_text())
    }
    assert named - set(settings.SWITCHES) == set()


def test_values_are_read_at_call_time(monkeypatch):
    monkeypatch.delenv("PDLIB_PREFILL_GEMM", raising=False)
    assert settings.get("PDLIB_PREFILL_GEMM") == "bf16x3"
    monkeypatch.setenv("PDLIB_PREFILL_GEMM", "fp32")
    assert settings.get("PDLIB_PREFILL_GEMM") == "fp32" and settings.current()["PDLIB_PREFILL_GEMM"] == "fp32"
    monkeypatch.setenv("PDLIB_PERSISTENT_BLOCKS", "66")
    assert settings.get("PDLIB_PERSISTENT_BLOCKS") == 66
    monkeypatch.setenv("PDLIB_DISAGG_PREFILL_CHUNK", "512")
    assert settings.get("PDLIB_DISAGG_PREFILL_CHUNK") == 512
    monkeypatch.setenv("PDLIB_DISAGG_PREFILL_CHUNK", "")  # empty: the default
    assert settings.get("PDLIB_DISAGG_PREFILL_CHUNK") == "whole"
    assert set(settings.current()) == set(settings.SWITCHES)


@pytest.mark.parametrize(
    "name, value, message",
    [
        (
            "PDLIB_PREFILL_GEMM",
            "tf32",
            "PDLIB_PREFILL_GEMM must be bf16x3 or tf32x2 or tf32x3 or fp32 or wgmma, got 'tf32'",
        ),
        ("PDLIB_PERSISTENT_BLOCKS", "0", "PDLIB_PERSISTENT_BLOCKS must be a whole number >= 1, got '0'"),
        ("PDLIB_OVERLAP_TIMEOUT_S", "soon", "PDLIB_OVERLAP_TIMEOUT_S must be a number > 0, got 'soon'"),
        ("PDLIB_OVERLAP_TIMEOUT_S", "nan", "PDLIB_OVERLAP_TIMEOUT_S must be a number > 0, got 'nan'"),
        ("PDLIB_KV_CACHE_GIB", "inf", "PDLIB_KV_CACHE_GIB must be a number > 0, at most 1000000000000000, got 'inf'"),
        (
            "PDLIB_PERSISTENT_BLOCKS",
            "9" * 20,
            f"PDLIB_PERSISTENT_BLOCKS must be a whole number >= 1, at most 2147483647, got '{'9' * 20}'",
        ),
        (
            "PDLIB_DISAGG_PREFILL_CHUNK",
            "1.5",
            "PDLIB_DISAGG_PREFILL_CHUNK must be whole or a whole number >= 1, got '1.5'",
        ),
    ],
)
def test_a_bad_value_is_refused_by_name(monkeypatch, name, value, message):
    monkeypatch.setenv(name, value)
    with pytest.raises(InputError, match=re.escape(message)):
        settings.get(name)


def test_the_decode_mode(monkeypatch):
    monkeypatch.delenv("PDLIB_DECODE", raising=False)
    assert settings.decode_mode() is None and settings.decode_mode("persistent") == "persistent"
    with pytest.raises(InputError, match="PDLIB_DECODE must be kernels or persistent, got 'fast'"):
        settings.decode_mode("fast")
