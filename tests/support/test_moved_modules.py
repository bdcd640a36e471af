"""The public modules that left `static_compiler.support` for
`static_compiler.jax_support` (support/ is numpy and the standard library
only): 0.1.0's from-import of them from support keeps working until 0.2.0,
warning with the path to use. (The old paths are spelled so that a
rewrite of the moved paths across the tree leaves this file alone.)"""

from __future__ import annotations

import importlib
import re
import warnings

import pytest

from static_compiler import support as package

OLD = "static_compiler.support"


@pytest.mark.parametrize("old", ["compile_events", "compilation_cache"])
def test_a_moved_module_warns_and_is_the_module_at_its_place(old):
    new = f"static_compiler.jax_support.{old}"
    with pytest.warns(DeprecationWarning, match=rf"static_compiler\.support\.{old} is deprecated and "
                                                rf"will be removed in 0\.2\.0 .*: use {re.escape(new)}$"):
        module = getattr(package, old)
    assert module is importlib.import_module(new)
    assert old not in dir(package)  # deprecated: not listed


def test_the_old_from_import_form_still_works():
    from static_compiler.jax_support.compile_events import CompileCounter

    with pytest.warns(DeprecationWarning, match=r"use static_compiler\.jax_support\.compile_events$"):
        old = __import__(OLD, fromlist=["compile_events"]).compile_events  # what the from-import runs
    assert old.CompileCounter is CompileCounter


def test_the_modules_that_stay_import_as_before_and_a_typo_is_an_attribute_error():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        from static_compiler.support import arguments, decode_types
    assert arguments.check_rows and decode_types.WarmReport
    with pytest.raises(AttributeError, match="has no attribute 'placement'"):
        package.placement  # noqa: B018 (internal: moved without an alias)
    with pytest.raises(AttributeError, match="has no attribute 'compile_event'"):
        package.compile_event  # noqa: B018
