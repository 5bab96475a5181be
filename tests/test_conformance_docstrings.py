"""The testing standard, kept true: every conformance test ends its docstring with the
planted bug (agentkeel_conformance.mutations) that fails it, or says in one line why none
applies; and every mutation is cited by the test that must catch it."""

from __future__ import annotations

import ast
import re

import pytest

from agentkeel.guarantees import GUARANTEES
from agentkeel_conformance.mutations import BY_NAME, MUTATIONS
from conftest import REPO

SUITE = REPO / "conformance" / "agentkeel_conformance"


def mutation_names() -> set[str]:
    return set(BY_NAME)


# "Mutation: <name>." or "Mutation: <name>; also <name>, <name> (why)."
CITATION = re.compile(r"^Mutation: (\w+)(?:; also (\w+(?:, \w+)*))?")


def cited(line: str) -> list[str]:
    """The mutations a docstring's last line names, the main one first."""
    match = CITATION.match(line)
    if match is None:
        return []
    return [match[1], *(match[2].split(", ") if match[2] else [])]


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


def test_every_mutation_has_a_name_of_its_own_and_a_known_guarantee():
    assert all(re.fullmatch(r"\w+", m.name) for m in MUTATIONS)
    assert len(BY_NAME) == len(MUTATIONS), "two mutations share a name"
    assert all(g in GUARANTEES for m in MUTATIONS for g in (m.guarantee, *m.also))


def test_every_mutation_applies_to_the_file_it_names():
    for mutation in MUTATIONS:
        source = (REPO / mutation.path).read_text()
        assert mutation.apply(source) != source, mutation.name


def test_every_mutation_is_cited_by_the_test_that_catches_it():
    """The test a mutation names as its catcher says so in its docstring."""
    citing: dict[str, set[str]] = {}
    for name, node in conformance_tests():
        last = (ast.get_docstring(node) or "").strip().splitlines()[-1:]
        for mutation_name in cited(last[0].strip()) if last else []:
            citing.setdefault(mutation_name, set()).add(name.split("::")[1])
    for mutation in MUTATIONS:
        assert mutation.caught_by in citing.get(mutation.name, set()), (
            f"{mutation.name}: {mutation.caught_by} does not end its docstring with "
            f"'Mutation: {mutation.name}'"
        )


def test_the_suite_has_tests_to_check():
    assert len(conformance_tests()) > 50


@pytest.mark.parametrize(
    ("name", "node"), conformance_tests(), ids=[name for name, _ in conformance_tests()]
)
def test_every_conformance_test_names_its_mutation_or_why_none_applies(name, node):
    doc = ast.get_docstring(node)
    assert doc, f"{name} has no docstring"
    last = doc.strip().splitlines()[-1].strip()
    if names := cited(last):
        unknown = [n for n in names if n not in mutation_names()]
        assert not unknown, f"{name} cites unknown mutations {unknown}"
    else:
        assert re.match(r"^No mutation: \S.{9,}", last), (
            f"{name}: the docstring's last line is neither 'Mutation: <name>' nor"
            f" 'No mutation: <reason>': {last!r}"
        )


def test_guarantee_marks_sit_on_tests():
    """A `@pytest.mark.guarantee` on a helper counts for nothing (pytest reads marks on
    tests and classes only): the test it was meant for would silently leave its row."""
    misplaced = []
    for path in sorted(SUITE.glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            marks = [ast.unparse(d) for d in node.decorator_list]
            if any("mark.guarantee" in m for m in marks) and not node.name.startswith("test_"):
                misplaced.append(f"{path.name}:{node.lineno} {node.name}")
    assert misplaced == []
