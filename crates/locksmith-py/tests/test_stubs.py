"""The `.pyi` stubs describe what the native module has, name for name."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import locksmith
import locksmith._base
import locksmith.aio

PACKAGE = Path(locksmith.__file__).parent


def stubbed(module_file: str) -> dict[str, set[str]]:
    """Classes of a stub file, each with the members it declares and those
    its base classes (in it or in `_base.pyi`) declare, all the way up."""
    classes = classes_of("_base.pyi")
    classes.update(classes_of(module_file))

    def members(name: str) -> set[str]:
        node = classes[name]
        found = set(members_of(node))
        for base in node.bases:
            if isinstance(base, ast.Subscript):  # ClientBase[Lock, ...]
                base = base.value
            if isinstance(base, ast.Name) and base.id in classes:
                found |= members(base.id)
        return found

    return {name: members(name) for name in classes_of(module_file)}


def classes_of(module_file: str) -> dict[str, ast.ClassDef]:
    tree = ast.parse((PACKAGE / module_file).read_text())
    return {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}


def members_of(node: ast.ClassDef):
    for member in node.body:
        if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield member.name


def public(cls: type) -> set[str]:
    return {
        name
        for name, _ in inspect.getmembers(cls)
        if not name.startswith("_")
        or name in {"__enter__", "__exit__", "__aenter__", "__aexit__", "__iter__",
                    "__next__", "__aiter__", "__anext__"}
    }


@pytest.mark.parametrize(
    "module, stub",
    [(locksmith, "__init__.pyi"), (locksmith.aio, "aio.pyi"), (locksmith._base, "_base.pyi")],
)
def test_stubs_match_the_native_classes(module, stub):
    classes = stubbed(stub)
    assert classes, stub
    for name, members in classes.items():
        runtime = getattr(module, name)
        assert members == public(runtime), f"{module.__name__}.{name}"
    for name in module.__all__:
        assert hasattr(module, name), name
