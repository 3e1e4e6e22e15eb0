"""Run first by `test_kernel_import_order` in a child pytest: it imports `triton.language`
at collection, as an in-process SGLang test imports it (compiled), before the interpreted
kernel tests of the same process run.  Not collected on its own (not `test_*.py`)."""

import triton.language  # noqa: F401


def test_triton_language_was_imported() -> None:
    assert triton.language.max is not None
