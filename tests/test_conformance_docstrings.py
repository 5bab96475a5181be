"""The testing standard, kept true: every conformance test ends its docstring with the
planted bug (an entry of MUTATIONS) that fails it, or says in one line why none applies."""

from __future__ import annotations

import ast
import re

import pytest

from conftest import REPO
from test_conformance_cli import MUTATIONS

SUITE = REPO / "conformance" / "agentkeel_conformance"
KEY = re.compile(r"^G\d+: (\w+), \S")


def mutation_names() -> set[str]:
    return {match[1] for key in MUTATIONS if (match := KEY.match(key))}


def conformance_tests() -> list[tuple[str, ast.FunctionDef]]:
    found = []
    for path in sorted(SUITE.glob("test_*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and (
                node.name.startswith("test")
            ):
                found.append((f"{path.name}::{node.name}", node))
    return found


def test_every_mutation_key_has_a_short_name():
    assert [key for key in MUTATIONS if not KEY.match(key)] == []
    assert len(mutation_names()) == len(MUTATIONS), "two mutations share a short name"


def test_the_suite_has_tests_to_check():
    assert len(conformance_tests()) > 50


@pytest.mark.parametrize(
    ("name", "node"), conformance_tests(), ids=[name for name, _ in conformance_tests()]
)
def test_every_conformance_test_names_its_mutation_or_why_none_applies(name, node):
    doc = ast.get_docstring(node)
    assert doc, f"{name} has no docstring"
    last = doc.strip().splitlines()[-1].strip()
    if match := re.match(r"^Mutation: (\w+)", last):
        assert match[1] in mutation_names(), f"{name} cites an unknown mutation {match[1]!r}"
    else:
        assert re.match(r"^No mutation: \S.{9,}", last), (
            f"{name}: the docstring's last line is neither 'Mutation: <name>' nor"
            f" 'No mutation: <reason>': {last!r}"
        )
