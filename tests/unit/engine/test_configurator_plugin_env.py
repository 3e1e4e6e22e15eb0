"""The SGLang plugin's one input, DSV4_INDEX_DTYPE, read without SGLang installed."""

from __future__ import annotations

import pytest

from dsv4_engine.configurator import ConfigError
from dsv4_engine.features import IndexDtype
from dsv4_engine.sglang_plugin import configured_index_dtype


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, IndexDtype.FP8), ("bf16", IndexDtype.BF16), (" FP4 ", IndexDtype.FP4)],
)
def test_index_dtype_from_environment(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv("DSV4_INDEX_DTYPE", raising=False)
    else:
        monkeypatch.setenv("DSV4_INDEX_DTYPE", value)
    assert configured_index_dtype() is expected


def test_bad_index_dtype_names_the_variable(monkeypatch):
    monkeypatch.setenv("DSV4_INDEX_DTYPE", "int8")
    with pytest.raises(
        ConfigError, match="DSV4_INDEX_DTYPE: expected one of fp8, bf16, fp4, got 'int8'"
    ):
        configured_index_dtype()
