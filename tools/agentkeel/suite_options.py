"""The conformance suite's own pytest options, in one place.

The suite's plugin registers them (agentkeel_conformance imports this module: the allowed
direction) and `agentkeel conformance --help` lists them, so the two cannot disagree while
tools/agentkeel never imports the conformance package.

In pytest every option carries the `--keel-` prefix (`--keel-dsn`, `--keel-owner-dsn`), so
loading the plugin never clashes with a user's own options; `agentkeel conformance` takes
the short spellings (`--dsn`, `--owner-dsn`) and maps them (plugin_args).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PREFIX = "--keel-"


@dataclass(frozen=True)
class SuiteOption:
    name: str  # "owner-dsn": pytest's --keel-owner-dsn, agentkeel conformance's --owner-dsn
    help: str
    metavar: str | None = None  # None: a flag without a value
    settings: dict[str, Any] = field(default_factory=dict)  # further addoption arguments

    @property
    def flag(self) -> str:
        """The plugin's pytest option."""
        return f"{PREFIX}{self.name}"

    @property
    def cli_flag(self) -> str:
        """The same option as `agentkeel conformance` spells it."""
        return f"--{self.name}"

    def addoption_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"help": self.help, **self.settings}
        if self.metavar is None:
            kwargs.setdefault("action", "store_true")
            kwargs.setdefault("default", False)
        else:
            kwargs["metavar"] = self.metavar
            kwargs.setdefault("default", None)
        return kwargs

    def usage(self) -> str:
        """How `agentkeel conformance --help` shows it."""
        if self.metavar is None:
            return self.cli_flag
        if self.settings.get("nargs") == "?":
            return f"{self.cli_flag} [{self.metavar}]"
        return f"{self.cli_flag} {self.metavar}"


SUITE_OPTIONS = (
    SuiteOption(
        "dsn",
        "Database under test (default $AGENTKEEL_DSN; else a throwaway embedded cluster).",
        "DSN",
    ),
    SuiteOption(
        "owner-dsn",
        "A member of keel_owner, to remove the suite's tenants and workflows and to run the "
        "owner-only tests (default $AGENTKEEL_OWNER_DSN, else the database under test).",
        "DSN",
    ),
    SuiteOption("read-only", "Run only the catalog checks: nothing is written to the database."),
    SuiteOption(
        "guarantee",
        "Run only the tests that prove these guarantees, comma-separated (G1,G5); the "
        "others are reported as not selected.",
        "G1[,G5...]",
    ),
    SuiteOption(
        "strict",
        "Fail the run (exit 1) when a selected guarantee is partial (some of its tests "
        "were skipped) or skipped (none ran), not only when one failed.",
    ),
    SuiteOption("migrate", "Apply agentkeel migrations to the database under test first."),
    SuiteOption(
        "testcontainers",
        "Test a PostgreSQL started in Docker (default image postgres:16-alpine).",
        "IMAGE",
        {"nargs": "?", "const": "postgres:16-alpine"},
    ),
    SuiteOption(
        "no-prepare",
        "Connect with prepare_threshold=None: needed through PgBouncer in transaction mode "
        "before 1.21 (or without max_prepared_statements).",
    ),
    SuiteOption(
        "artifacts",
        "Folder for failure artifacts (default ./agentkeel-artifacts).",
        "DIR",
        {"default": "agentkeel-artifacts"},
    ),
)


def plugin_args(args: list[str]) -> list[str]:
    """`agentkeel conformance` arguments with the suite's short spellings (`--owner-dsn X`,
    `--artifacts=DIR`) rewritten to the plugin's (`--keel-owner-dsn`); the rest unchanged."""
    names = {o.cli_flag: o.flag for o in SUITE_OPTIONS}
    mapped = []
    for arg in args:
        flag, eq, value = arg.partition("=")
        mapped.append(names[flag] + eq + value if flag in names else arg)
    return mapped


def option_value(args: list[str], flag: str) -> str | None:
    """The value given to flag in args (`--flag X` or `--flag=X`; the last one counts), or
    None; "" when the flag ends the arguments without a value."""
    value = None
    for i, arg in enumerate(args):
        if arg == flag:
            value = args[i + 1] if i + 1 < len(args) else ""
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1 :]
    return value
