"""The `.pyi` stubs describe what the native module has, name for name."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import locksmith
import locksmith.aio

PACKAGE = Path(locksmith.__file__).parent


def stubbed(module_file: str) -> dict[str, set[str]]:
    """Classes of a stub file, each with the members it declares."""
    tree = ast.parse((PACKAGE / module_file).read_text())
    return {
        node.name: {
            member.name
            for member in node.body
            if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef))
        }
        for node in tree.body
        if isinstance(node, ast.ClassDef)
    }


def public(cls: type) -> set[str]:
    return {
        name
        for name, _ in inspect.getmembers(cls)
        if not name.startswith("_")
        or name in {"__enter__", "__exit__", "__aenter__", "__aexit__", "__iter__",
                    "__next__", "__aiter__", "__anext__"}
    }


@pytest.mark.parametrize(
    "module, stub", [(locksmith, "__init__.pyi"), (locksmith.aio, "aio.pyi")]
)
def test_stubs_match_the_native_classes(module, stub):
    classes = stubbed(stub)
    assert classes, stub
    for name, members in classes.items():
        runtime = getattr(module, name)
        assert members == public(runtime), f"{module.__name__}.{name}"
    for name in module.__all__:
        assert hasattr(module, name), name
