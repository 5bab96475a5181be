"""`agentkeel check`: read-only catalog posture checks, one SQL file per rule.

Each file in checks/ is a plain query returning rows of one shape (rule, object,
problem, remedy), so a DBA can run it with psql as well.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass
from pathlib import Path

import psycopg

CHECKS_DIR = Path(__file__).resolve().parent / "checks"


@dataclass(frozen=True)
class Finding:
    rule: str
    object: str
    problem: str
    remedy: str


class SchemaMissing(Exception):
    """The database has no agentkeel schema to check."""


def rule_files() -> list[Path]:
    return sorted(CHECKS_DIR.glob("*.sql"))


def _findings(conn: psycopg.Connection, path: Path) -> list[Finding]:
    rows = conn.execute(path.read_text(encoding="utf-8").encode()).fetchall()
    return [Finding(*(str(v) for v in r)) for r in rows]


def run_rule(conn: psycopg.Connection, path: Path) -> list[Finding]:
    """One rule's findings, in a read-only transaction of its own."""
    with conn.transaction():
        conn.execute("set transaction read only")
        return _findings(conn, path)


def run_checks(conn: psycopg.Connection) -> dict[str, list[Finding]]:
    """Every rule's findings (empty lists for rules that pass), in one read-only transaction."""
    with conn.transaction():
        conn.execute("set transaction read only")
        row = conn.execute("select to_regnamespace('keel') is not null").fetchone()
        if not row or not row[0]:
            raise SchemaMissing("the database has no keel schema: run `agentkeel migrate up` first")
        return {path.stem: _findings(conn, path) for path in rule_files()}


def to_json(results: dict[str, list[Finding]]) -> str:
    return json.dumps(
        {
            "rules": sorted(results),
            "findings": [asdict(f) for findings in results.values() for f in findings],
        },
        indent=2,
    )


def to_junit(results: dict[str, list[Finding]]) -> str:
    failures = sum(1 for findings in results.values() if findings)
    suite = ET.Element(
        "testsuite",
        name="agentkeel check",
        tests=str(len(results)),
        failures=str(failures),
        errors="0",
    )
    for rule, findings in sorted(results.items()):
        case = ET.SubElement(suite, "testcase", classname="agentkeel.check", name=rule)
        if findings:
            failure = ET.SubElement(
                case, "failure", message=f"{len(findings)} finding(s)", type="finding"
            )
            failure.text = "\n".join(
                f"{f.object}: {f.problem}\n  remedy: {f.remedy}" for f in findings
            )
    return ET.tostring(suite, encoding="unicode", xml_declaration=True)
