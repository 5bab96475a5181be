"""The conformance suite's own pytest options, in one place.

The suite's plugin registers them (agentkeel_conformance imports this module: the allowed
direction) and `agentkeel conformance --help` lists them, so the two cannot disagree while
tools/agentkeel never imports the conformance package.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class SuiteOption:
    flag: str
    help: str
    metavar: str | None = None  # None: a flag without a value
    settings: dict[str, Any] = field(default_factory=dict)  # further addoption arguments

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
        if self.metavar is None:
            return self.flag
        if self.settings.get("nargs") == "?":
            return f"{self.flag} [{self.metavar}]"
        return f"{self.flag} {self.metavar}"


SUITE_OPTIONS = (
    SuiteOption(
        "--dsn",
        "Database under test (default $AGENTKEEL_DSN; else a throwaway embedded cluster).",
        "DSN",
    ),
    SuiteOption(
        "--owner-dsn",
        "A member of keel_owner, to remove the suite's tenants and workflows and to run the "
        "owner-only tests (default $AGENTKEEL_OWNER_DSN, else --dsn).",
        "DSN",
    ),
    SuiteOption("--read-only", "Run only the catalog checks: nothing is written to the database."),
    SuiteOption("--migrate", "Apply agentkeel migrations to the --dsn database before testing."),
    SuiteOption(
        "--testcontainers",
        "Test a PostgreSQL started in Docker (default image postgres:16-alpine).",
        "IMAGE",
        {"nargs": "?", "const": "postgres:16-alpine"},
    ),
    SuiteOption(
        "--no-prepare",
        "Connect with prepare_threshold=None: needed through PgBouncer in transaction mode "
        "before 1.21 (or without max_prepared_statements).",
    ),
    SuiteOption(
        "--artifacts",
        "Folder for failure artifacts (default ./agentkeel-artifacts).",
        "DIR",
        {"default": "agentkeel-artifacts"},
    ),
)
