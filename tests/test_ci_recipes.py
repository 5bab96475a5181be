"""The CI recipes in docs/ci parse, and every agentkeel command and option they use exists."""

from __future__ import annotations

import re
import shlex

import yaml

from conftest import REPO, run_agentkeel

RECIPES = REPO / "docs" / "ci"


def agentkeel_lines(text: str) -> list[list[str]]:
    return [
        shlex.split(line.strip())[1:]
        for line in text.splitlines()
        if re.match(r"\s*agentkeel ", line)
    ]


def commands_of(document: object) -> list[list[str]]:
    found: list[list[str]] = []
    if isinstance(document, dict):
        for value in document.values():
            found += commands_of(value)
    elif isinstance(document, list):
        for value in document:
            found += commands_of(value)
    elif isinstance(document, str):
        found += agentkeel_lines(document if "\n" in document else document + "\n")
    return found


def assert_commands_exist(commands: list[list[str]]) -> None:
    assert commands
    for argv in commands:
        words = [a for a in argv if not a.startswith("-")][:2]
        sub = words[:2] if words and words[0] == "migrate" else words[:1]
        help_text = run_agentkeel(*sub, "--help").stdout
        assert "Usage:" in help_text, sub
        if sub != ["conformance"]:  # its options are pytest's
            for option in (a.split("=")[0] for a in argv if a.startswith("--")):
                assert option in help_text, f"agentkeel {' '.join(sub)} has no {option}"


def test_the_github_actions_workflow():
    workflow = yaml.safe_load((RECIPES / "github-actions.yml").read_text())
    job = workflow["jobs"]["schema"]
    assert job["services"]["postgres"]["image"].startswith("postgres:")
    assert "AGENTKEEL_DSN" in job["env"]
    commands = commands_of(job["steps"])
    joined = [" ".join(c) for c in commands]
    for expected in ("lint", "migrate up", "migrate validate", "check", "conformance"):
        assert any(c.startswith(expected) for c in joined), expected
    assert any("--junitxml=" in c for c in joined) and any("--format junit" in c for c in joined)
    assert_commands_exist(commands)


def test_the_pre_commit_configuration():
    config = yaml.safe_load((RECIPES / "pre-commit-config.yaml").read_text())
    (hook,) = config["repos"][0]["hooks"]
    assert hook["id"] == "agentkeel-lint" and hook["pass_filenames"] is False
    assert_commands_exist([shlex.split(hook["entry"])[1:]])
