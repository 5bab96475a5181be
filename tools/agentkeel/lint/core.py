"""The Finding type, the loaded SQL files and tables, and the output formats."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pglast import parse_sql
from pglast.ast import Node
from pglast.parser import ParseError

# A file may waive a rule for itself, with the reason in the same comment:
#   -- agentkeel:allow citus.tenant_filter (the one cross-tenant claim)
ALLOW = re.compile(r"--\s*agentkeel:allow\s+([\w.-]+)")
TENANT_COLUMN = "tenant_id"


@dataclass(frozen=True, order=True)
class Finding:
    file: str
    line: int
    rule: str
    message: str
    hint: str = ""  # what to do about it, in agentkeel's terms

    def human(self) -> str:
        hint = f" (hint: {self.hint})" if self.hint else ""
        return f"{self.file}:{self.line}: {self.rule}: {self.message}{hint}"

    def github(self) -> str:
        text = f"{self.message} Hint: {self.hint}" if self.hint else self.message
        # Workflow commands end at a newline; escape it as GitHub documents.
        text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
        return f"::error file={self.file},line={self.line},title={self.rule}::{text}"


@dataclass
class SqlFile:
    path: Path
    name: str  # as reported: relative to the lint root
    text: str
    statements: list[tuple[Any, int]] = field(default_factory=list)  # (node, line)
    allowed: set[str] = field(default_factory=set)
    locations: list[int] = field(default_factory=list)  # offset of each statement

    def line_of(self, offset: int) -> int:
        return self.text.count("\n", 0, max(offset, 0)) + 1


@dataclass
class Table:
    name: str  # schema-qualified
    file: SqlFile
    line: int
    columns: set[str]
    column_defs: dict[str, Any] = field(default_factory=dict)  # name -> ColumnDef

    @property
    def tenant(self) -> bool:
        return TENANT_COLUMN in self.columns


def qualified(rangevar: Any) -> str:
    return f"{rangevar.schemaname or 'public'}.{rangevar.relname}"


def names(nodes: Iterable[Any] | None) -> list[str]:
    return [n.sval for n in nodes or ()]


def kind(node: Any) -> str:
    return type(node).__name__


def load(paths: list[Path], root: Path) -> tuple[list[SqlFile], list[Finding]]:
    files: list[SqlFile] = []
    findings: list[Finding] = []
    for path in sorted(set(sql_paths(paths))):
        name = str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
        sql_file = SqlFile(path, name, path.read_text(encoding="utf-8"))
        sql_file.allowed = set(ALLOW.findall(sql_file.text))
        try:
            raws = parse_sql(sql_file.text)
            sql_file.statements = [
                (raw.stmt, sql_file.line_of(raw.stmt_location or 0)) for raw in raws
            ]
            sql_file.locations = [raw.stmt_location or 0 for raw in raws]
        except ParseError as err:
            offset = err.args[1] if len(err.args) > 1 and isinstance(err.args[1], int) else 0
            findings.append(Finding(name, sql_file.line_of(offset), "parse", str(err.args[0])))
        files.append(sql_file)
    return files, findings


def sql_paths(paths: list[Path]) -> Iterator[Path]:
    for path in paths:
        if path.is_dir():
            yield from (p for p in path.rglob("*.sql") if ".venv" not in p.parts)
        elif path.suffix == ".sql":
            yield path


def tables(files: list[SqlFile]) -> dict[str, Table]:
    found: dict[str, Table] = {}
    for f in files:
        for stmt, line in f.statements:
            if kind(stmt) == "CreateStmt":
                defs = {e.colname: e for e in stmt.tableElts or () if kind(e) == "ColumnDef"}
                name = qualified(stmt.relation)
                found[name] = Table(name, f, line, set(defs), defs)
    return found


def to_json(findings: list[Finding]) -> str:
    return json.dumps([asdict(f) for f in findings], indent=2)


def render(findings: list[Finding], fmt: str) -> str:
    """The findings in one of the output formats: human, json or github."""
    if fmt == "json":
        return to_json(findings)
    return "\n".join(f.github() if fmt == "github" else f.human() for f in findings)


def constraints(stmt: Any) -> Iterator[tuple[Any, str | None]]:
    """(constraint, column it is attached to) of a CREATE TABLE or ALTER TABLE ADD."""
    from pglast.enums import AlterTableType

    if kind(stmt) == "CreateStmt":
        for elt in stmt.tableElts or ():
            if kind(elt) == "Constraint":
                yield elt, None
            elif kind(elt) == "ColumnDef":
                for con in elt.constraints or ():
                    yield con, elt.colname
    elif kind(stmt) == "AlterTableStmt":
        for cmd in stmt.cmds or ():
            if cmd.subtype == AlterTableType.AT_AddConstraint and cmd.def_ is not None:
                yield cmd.def_, None


def walk(node: Any) -> Iterator[Any]:
    """The node and every pglast node below it."""
    if isinstance(node, list | tuple):
        for item in node:
            yield from walk(item)
    elif isinstance(node, Node):
        yield node
        for slot in getattr(type(node), "__slots__", ()):
            yield from walk(getattr(node, slot, None))


def relations(node: Any) -> set[str]:
    """The schema-qualified names of the tables a statement reads or writes."""
    return {qualified(n) for n in walk(node) if kind(n) == "RangeVar"}
