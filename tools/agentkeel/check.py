"""`agentkeel check`: read-only catalog posture checks, one SQL file per rule.

Each file in checks/ is a plain query returning rows of one shape (rule, guarantee,
level, object, problem, remedy), so a DBA can run it with psql as well. The file itself
says which guarantee it checks: its first select names it as a literal
(`'G4' as guarantee`), which is read from the text before any database is reached (the
conformance suite marks its tests with it) and compared with every row the rule returns.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass
from pathlib import Path

import psycopg

from agentkeel.preflight import has_schema

CHECKS_DIR = Path(__file__).resolve().parent / "checks"

# The result columns every rule returns, in this order.
COLUMNS = ("rule", "guarantee", "level", "object", "problem", "remedy")
LEVELS = ("error", "warning")
# The guarantee literal of a rule file, e.g. `'G4' as guarantee`: exactly one per file.
GUARANTEE = re.compile(r"'(G\d+)'\s+as\s+guarantee\b")
# A rule that only means something with an extension (`-- agentkeel:needs citus`): where
# the extension is not installed it reports nothing, and is not run. `superuser` after it:
# it reads what only a superuser may (every worker, through run_command_on_workers).
NEEDS = re.compile(r"^-- agentkeel:needs (\w+)( superuser)?", re.MULTILINE)


@dataclass(frozen=True)
class Finding:
    rule: str
    guarantee: str
    level: str
    object: str
    problem: str
    remedy: str


class SchemaMissing(Exception):
    """The database has no agentkeel schema to check."""


class CheckNotPermitted(Exception):
    """The role may not read the keel schema, so no rule can run."""


class RuleError(Exception):
    """A rule file is malformed: no guarantee, or rows that contradict it."""


def rule_files() -> list[Path]:
    return sorted(CHECKS_DIR.glob("*.sql"))


def rule_guarantee(path: Path) -> str:
    """The guarantee a rule file checks, as the file itself states it."""
    found: set[str] = set(GUARANTEE.findall(path.read_text(encoding="utf-8")))
    if len(found) != 1:
        raise RuleError(
            f"{path.name}: a rule names exactly one guarantee as `'G<n>' as guarantee`,"
            f" found {sorted(found) or 'none'}"
        )
    return found.pop()


def rule_needs(path: Path) -> str | None:
    """The extension a rule needs (`-- agentkeel:needs <extension>`), if any."""
    found = NEEDS.search(path.read_text(encoding="utf-8"))
    return found.group(1) if found else None


def rule_unmet(conn: psycopg.Connection, path: Path) -> tuple[bool, str] | None:
    """Why a rule cannot run here, if it cannot: (applies, reason). applies is False when
    the rule means nothing in this database (its extension is not installed), True when it
    does but the role may not read what it reads."""
    found = NEEDS.search(path.read_text(encoding="utf-8"))
    if found is None:
        return None
    row = conn.execute(
        "select exists (select 1 from pg_catalog.pg_extension where extname = %s),"
        " (select rolsuper from pg_catalog.pg_roles where rolname = current_user)",
        (found.group(1),),
    ).fetchone()
    assert row is not None
    installed, superuser = row
    if not installed:
        return False, f"{found.group(1)} is not installed"
    if found.group(2) and not superuser:
        return True, f"it reads every {found.group(1)} node: run agentkeel check as a superuser"
    return None


def _findings(conn: psycopg.Connection, path: Path) -> list[Finding]:
    guarantee = rule_guarantee(path)
    unmet = rule_unmet(conn, path)
    if unmet is not None:
        applies, reason = unmet
        if not applies:
            return []
        return [Finding(path.stem, guarantee, "warning", path.name, f"not checked: {reason}", "")]
    cursor = conn.execute(path.read_text(encoding="utf-8").encode())
    columns = tuple(d.name for d in cursor.description or ())
    if columns != COLUMNS:
        raise RuleError(f"{path.name}: returns columns {columns}, not {COLUMNS}")
    findings = [Finding(*(str(v) for v in r)) for r in cursor.fetchall()]
    for f in findings:
        if (f.rule, f.guarantee) != (path.stem, guarantee) or f.level not in LEVELS:
            raise RuleError(
                f"{path.name}: a row says rule {f.rule!r}, guarantee {f.guarantee!r}, level"
                f" {f.level!r}; the file is rule {path.stem!r} of {guarantee}, levels {LEVELS}"
            )
    return findings


def run_rule(conn: psycopg.Connection, path: Path) -> list[Finding]:
    """One rule's findings, in a read-only transaction of its own."""
    with conn.transaction():
        conn.execute("set transaction read only")
        return _findings(conn, path)


def run_checks(conn: psycopg.Connection) -> dict[str, list[Finding]]:
    """Every rule's findings (empty lists for rules that pass), in one read-only transaction."""
    with conn.transaction():
        conn.execute("set transaction read only")
        if not has_schema(conn):
            raise SchemaMissing("the database has no keel schema: run `agentkeel migrate up` first")
        row = conn.execute("select current_user, has_schema_privilege('keel', 'USAGE')").fetchone()
        if not row or not row[1]:
            raise CheckNotPermitted(
                f"role {row[0] if row else '?'} may not read the keel schema, so no rule can "
                "run: run `agentkeel check` as the migrator or a member of a keel_* role "
                "(keel_auditor is enough)"
            )
        return {path.stem: _guarded(conn, path) for path in rule_files()}


def _guarded(conn: psycopg.Connection, path: Path) -> list[Finding]:
    """A rule's findings; a rule the database cannot run (a schema older than this
    agentkeel, say) is a finding of its own, and the other rules still run."""
    try:
        with conn.transaction():  # a savepoint
            return _findings(conn, path)
    except psycopg.Error as e:
        remedy = (
            "Run `agentkeel check` as the migrator (a member of keel_owner)."
            if isinstance(e, psycopg.errors.InsufficientPrivilege)
            else "Run `agentkeel migrate up` with this agentkeel version, then check again."
        )
        return [
            Finding(
                path.stem,
                rule_guarantee(path),
                "error",
                path.name,
                f"the rule could not run: {e.sqlstate}: {str(e).splitlines()[0]}",
                remedy,
            )
        ]


def failing_findings(results: dict[str, list[Finding]]) -> list[Finding]:
    """The findings that fail the check (warnings are reported, and pass)."""
    return [f for findings in results.values() for f in findings if f.level == "error"]


def to_json(results: dict[str, list[Finding]]) -> str:
    return json.dumps(
        {
            "rules": sorted(results),
            "findings": [asdict(f) for findings in results.values() for f in findings],
        },
        indent=2,
    )


def to_junit(results: dict[str, list[Finding]]) -> str:
    failed = {f.rule for f in failing_findings(results)}
    suite = ET.Element(
        "testsuite",
        name="agentkeel check",
        tests=str(len(results)),
        failures=str(len(failed)),
        errors="0",
    )
    for rule, findings in sorted(results.items()):
        case = ET.SubElement(suite, "testcase", classname="agentkeel.check", name=rule)
        ET.SubElement(
            ET.SubElement(case, "properties"),
            "property",
            name="guarantee",
            value=rule_guarantee(CHECKS_DIR / f"{rule}.sql"),
        )
        text = "\n".join(
            f"{f.level}: {f.object}: {f.problem}\n  remedy: {f.remedy}" for f in findings
        )
        if rule in failed:
            failure = ET.SubElement(
                case, "failure", message=f"{len(findings)} finding(s)", type="finding"
            )
            failure.text = text
        elif findings:
            ET.SubElement(case, "system-out").text = text
    return ET.tostring(suite, encoding="unicode", xml_declaration=True)
