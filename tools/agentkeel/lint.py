"""`agentkeel lint`: static checks of the SQL files, before they reach a database.

Three sources of findings, all reported as `file:line: rule: message`:
- sqlfluff (style and parse errors) and squawk (migration safety, schema/ only), run with
  the project's .sqlfluff and .squawk.toml;
- invariants read from the statements with pglast: tenant keys, row-level security,
  SECURITY DEFINER hygiene, documented error codes, released migrations left unedited;
- the `citus` family: the rules of CITUS.md §(c) that can be decided from the files.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pglast import parse_sql
from pglast.enums import AlterTableType, ConstrType, ObjectType
from pglast.parser import ParseError

from agentkeel.distribute import LOCAL_TABLES

# A file may waive a rule for itself, with the reason in the same comment:
#   -- agentkeel:allow citus.tenant_filter (the one cross-tenant claim)
ALLOW = re.compile(r"--\s*agentkeel:allow\s+([\w.]+)")
TENANT_COLUMN = "tenant_id"
IMPLEMENTATION_DEFINED = "IJKLMNOPQRSTUVWXYZ"  # a subclass letter a standard never uses


@dataclass(frozen=True, order=True)
class Finding:
    file: str
    line: int
    rule: str
    message: str

    def human(self) -> str:
        return f"{self.file}:{self.line}: {self.rule}: {self.message}"

    def github(self) -> str:
        return f"::error file={self.file},line={self.line},title={self.rule}::{self.message}"


@dataclass
class SqlFile:
    path: Path
    name: str  # as reported: relative to the lint root
    text: str
    statements: list[tuple[Any, int]] = field(default_factory=list)  # (node, line)
    allowed: set[str] = field(default_factory=set)

    def line_of(self, offset: int) -> int:
        return self.text.count("\n", 0, max(offset, 0)) + 1


@dataclass
class Table:
    name: str  # schema-qualified
    file: SqlFile
    line: int
    columns: set[str]

    @property
    def tenant(self) -> bool:
        return TENANT_COLUMN in self.columns


def _qualified(rangevar: Any) -> str:
    return f"{rangevar.schemaname or 'public'}.{rangevar.relname}"


def _names(nodes: Iterable[Any] | None) -> list[str]:
    return [n.sval for n in nodes or ()]


def load(paths: list[Path], root: Path) -> tuple[list[SqlFile], list[Finding]]:
    files: list[SqlFile] = []
    findings: list[Finding] = []
    for path in sorted({p for p in _sql_paths(paths)}):
        name = str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
        sql_file = SqlFile(path, name, path.read_text(encoding="utf-8"))
        sql_file.allowed = set(ALLOW.findall(sql_file.text))
        try:
            sql_file.statements = [
                (raw.stmt, sql_file.line_of(raw.stmt_location or 0))
                for raw in parse_sql(sql_file.text)
            ]
        except ParseError as err:
            offset = err.args[1] if len(err.args) > 1 and isinstance(err.args[1], int) else 0
            findings.append(Finding(name, sql_file.line_of(offset), "parse", str(err.args[0])))
        files.append(sql_file)
    return files, findings


def _sql_paths(paths: list[Path]) -> Iterator[Path]:
    for path in paths:
        if path.is_dir():
            yield from (p for p in path.rglob("*.sql") if ".venv" not in p.parts)
        elif path.suffix == ".sql":
            yield path


# -- invariants from the statements ---------------------------------------------------


def tables(files: list[SqlFile]) -> dict[str, Table]:
    found: dict[str, Table] = {}
    for f in files:
        for stmt, line in f.statements:
            if type(stmt).__name__ == "CreateStmt":
                cols = {e.colname for e in stmt.tableElts or () if type(e).__name__ == "ColumnDef"}
                found[_qualified(stmt.relation)] = Table(_qualified(stmt.relation), f, line, cols)
    return found


def _constraints(stmt: Any) -> Iterator[tuple[Any, str | None]]:
    """(constraint, column it is attached to) of a CREATE TABLE or ALTER TABLE ADD."""
    name = type(stmt).__name__
    if name == "CreateStmt":
        for elt in stmt.tableElts or ():
            if type(elt).__name__ == "Constraint":
                yield elt, None
            elif type(elt).__name__ == "ColumnDef":
                for con in elt.constraints or ():
                    yield con, elt.colname
    elif name == "AlterTableStmt":
        for cmd in stmt.cmds or ():
            if cmd.subtype == AlterTableType.AT_AddConstraint and cmd.def_ is not None:
                yield cmd.def_, None


def check_tenant_keys(files: list[SqlFile], known: dict[str, Table]) -> Iterator[Finding]:
    for f in files:
        for stmt, line in f.statements:
            kind = type(stmt).__name__
            if kind in ("CreateStmt", "AlterTableStmt"):
                table = known.get(_qualified(stmt.relation))
                if table is None or not table.tenant:
                    continue
                for con, column in _constraints(stmt):
                    keys = [column] if column else _names(con.keys)
                    label = con.conname or "an unnamed constraint"
                    if con.contype in (ConstrType.CONSTR_PRIMARY, ConstrType.CONSTR_UNIQUE):
                        if TENANT_COLUMN not in keys:
                            yield Finding(
                                f.name,
                                line,
                                "tenant_keys",
                                f"{table.name}: {label} does not include tenant_id",
                            )
                    elif con.contype == ConstrType.CONSTR_FOREIGN:
                        local = [column] if column else _names(con.fk_attrs)
                        target = known.get(_qualified(con.pktable))
                        remote = _names(con.pk_attrs)
                        if target is not None and not target.tenant:
                            continue  # a tenant table may reference a global one
                        if TENANT_COLUMN not in local:
                            yield Finding(
                                f.name,
                                line,
                                "tenant_keys",
                                f"{table.name}: foreign key {label} does not include tenant_id",
                            )
                        elif (
                            target is not None
                            and target.tenant
                            and (
                                len(remote) != len(local)
                                or remote[local.index(TENANT_COLUMN)] != TENANT_COLUMN
                            )
                        ):
                            yield Finding(
                                f.name,
                                line,
                                "tenant_keys",
                                f"{table.name}: foreign key {label} does not pair tenant_id "
                                f"with {target.name}.tenant_id",
                            )
            elif kind == "IndexStmt" and stmt.unique:
                table = known.get(_qualified(stmt.relation))
                cols = [p.name for p in stmt.indexParams or ()]
                if table is not None and table.tenant and TENANT_COLUMN not in cols:
                    yield Finding(
                        f.name,
                        line,
                        "tenant_keys",
                        f"{table.name}: unique index {stmt.idxname} does not include tenant_id",
                    )


def check_rls(files: list[SqlFile], known: dict[str, Table]) -> Iterator[Finding]:
    """Every tenant table has RLS enabled, forced and a policy: explicitly, or through the
    catalog loop in policies/ that covers every table with a tenant_id column."""
    loop = {"enable": False, "force": False, "policy": False}
    explicit: dict[str, set[str]] = {}
    for f in files:
        for stmt, line in f.statements:
            kind = type(stmt).__name__
            if kind == "DoStmt" and f.name.startswith("policies/"):
                body = " ".join(
                    str(a.arg.sval) for a in stmt.args or () if a.defname == "as"
                ).lower()
                if "tenant_id" in body and "pg_attribute" in body:
                    loop["enable"] |= "enable row level security" in body
                    loop["force"] |= "force row level security" in body
                    loop["policy"] |= "create policy" in body
            elif kind == "AlterTableStmt":
                target = _qualified(stmt.relation)
                for cmd in stmt.cmds or ():
                    if cmd.subtype == AlterTableType.AT_EnableRowSecurity:
                        explicit.setdefault(target, set()).add("enable")
                    elif cmd.subtype == AlterTableType.AT_ForceRowSecurity:
                        explicit.setdefault(target, set()).add("force")
                    elif cmd.subtype == AlterTableType.AT_NoForceRowSecurity:
                        yield Finding(
                            f.name,
                            line,
                            "rls",
                            f"{target}: NO FORCE ROW LEVEL SECURITY "
                            "lets the table owner bypass tenant isolation",
                        )
                    elif cmd.subtype == AlterTableType.AT_DisableRowSecurity:
                        yield Finding(
                            f.name,
                            line,
                            "rls",
                            f"{target}: DISABLE ROW LEVEL SECURITY removes tenant isolation",
                        )
            elif kind == "CreatePolicyStmt":
                explicit.setdefault(_qualified(stmt.table), set()).add("policy")
            elif kind == "DropStmt" and stmt.removeType == ObjectType.OBJECT_POLICY:
                for obj in stmt.objects or ():
                    parts = _names(obj)
                    on_table = ".".join(parts[:-1])
                    recreated = any(
                        type(s).__name__ == "CreatePolicyStmt"
                        and _qualified(s.table) == on_table
                        and s.policy_name == parts[-1]
                        for s, _ in f.statements
                    )
                    if not recreated:
                        yield Finding(
                            f.name,
                            line,
                            "rls",
                            f"{on_table}: policy {parts[-1]} is dropped and not created again",
                        )
    for table in known.values():
        if not table.tenant:
            continue
        for need in ("enable", "force", "policy"):
            if not loop[need] and need not in explicit.get(table.name, set()):
                what = {"enable": "enabled", "force": "forced", "policy": "given a tenant policy"}[
                    need
                ]
                yield Finding(
                    table.file.name,
                    table.line,
                    "rls",
                    f"{table.name} has tenant_id but row-level security is never {what}",
                )


def check_security_definer(files: list[SqlFile]) -> Iterator[Finding]:
    for f in files:
        for stmt, line in f.statements:
            if type(stmt).__name__ != "CreateFunctionStmt":
                continue
            options = {o.defname: o.arg for o in stmt.options or ()}
            definer = options.get("security")
            if definer is None or not definer.boolval:
                continue
            pinned = any(
                o.defname == "set" and getattr(o.arg, "name", None) == "search_path"
                for o in stmt.options or ()
            )
            if not pinned:
                name = ".".join(_names(stmt.funcname))
                yield Finding(
                    f.name,
                    line,
                    "security_definer",
                    f"{name} is SECURITY DEFINER without SET search_path",
                )


def registry_codes(files: list[SqlFile]) -> set[str]:
    for f in files:
        if f.name.endswith("error_codes.sql"):
            return set(re.findall(r"\('([0-9A-Z]{5})',", f.text))
    return set()


RAISE = re.compile(r"\braise\s+exception\b(.*?);", re.IGNORECASE | re.DOTALL)
ERRCODE = re.compile(r"errcode\s*=\s*'([0-9A-Za-z]{5})'", re.IGNORECASE)


def check_errcodes(files: list[SqlFile]) -> Iterator[Finding]:
    codes = registry_codes(files)
    for f in files:
        for match in RAISE.finditer(f.text):
            found = ERRCODE.search(match.group(1))
            line = f.line_of(match.start())
            if found is None:
                yield Finding(
                    f.name,
                    line,
                    "errcodes",
                    "RAISE EXCEPTION without an ERRCODE "
                    "(callers could only match the message text)",
                )
            elif found.group(1).upper() == "P0001":
                yield Finding(f.name, line, "errcodes", "P0001 is the generic raise_exception code")
            elif found.group(1)[2] in IMPLEMENTATION_DEFINED and found.group(1) not in codes:
                yield Finding(
                    f.name,
                    line,
                    "errcodes",
                    f"ERRCODE {found.group(1)} is not in keel.error_codes()",
                )


def check_released(root: Path) -> Iterator[Finding]:
    """A versioned migration changed or removed since the newest release tag."""
    git = shutil.which("git")
    if git is None:
        return
    tags = subprocess.run(
        [git, "tag", "--list", "--sort=-creatordate"],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    if tags.returncode != 0 or not tags.stdout.strip():
        return
    tag = tags.stdout.split()[0]
    diff = subprocess.run(
        [git, "diff", "--name-status", tag, "--", "schema/"],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    for row in diff.stdout.splitlines():
        status, _, path = row.partition("\t")
        if status[:1] in ("M", "D", "R"):
            yield Finding(
                path,
                1,
                "released_migration",
                f"released in {tag} and {'edited' if status[0] == 'M' else 'removed'} "
                "since: add a new migration instead",
            )


# -- citus ----------------------------------------------------------------------------


STATEMENT = re.compile(r"(?is)\b(select|update|delete|insert)\b.*?;")
TENANT_FILTER = re.compile(r"tenant_id\s*=\s*[pv]_\w+|tenant_id\s*=\s*\(?[pv]_", re.IGNORECASE)
ROW_LOCK = re.compile(
    r"\bfor\s+(update|no\s+key\s+update|share|key\s+share)\b|skip\s+locked|nowait", re.I
)
VOLATILE = re.compile(
    r"\b(now|clock_timestamp|statement_timestamp|random|gen_random_uuid|"
    r"current_setting|nextval|uuid_generate_\w+)\s*\(",
    re.IGNORECASE,
)


def _bodies(f: SqlFile) -> Iterator[tuple[str, int]]:
    """(PL/pgSQL body, its first line) of each function created in the file."""
    for stmt, _ in f.statements:
        if type(stmt).__name__ != "CreateFunctionStmt":
            continue
        for option in stmt.options or ():
            if option.defname == "as":
                body = option.arg[0].sval
                start = f.text.find(body)
                yield body, f.line_of(start) if start >= 0 else 1


def check_citus(files: list[SqlFile], known: dict[str, Table]) -> Iterator[Finding]:
    tenant_names = {t.name for t in known.values() if t.tenant}
    shared_names = {t.name for t in known.values() if t.name not in LOCAL_TABLES}
    for f in files:
        for match in re.finditer(r"set_config\s*\(\s*'keel\.", f.text, re.IGNORECASE):
            yield Finding(
                f.name,
                f.line_of(match.start()),
                "citus.set_config",
                "set_config('keel.…') does not reach the workers: use SET LOCAL",
            )
        for match in re.finditer(r"(?im)^\s*set\s+(?!local\b)(session\s+)?keel\.", f.text):
            yield Finding(
                f.name,
                f.line_of(match.start()),
                "citus.set_config",
                "a session-level SET keel.… outlives the transaction: use SET LOCAL",
            )
        for match in re.finditer(
            r"\bpg_(try_)?advisory_\w+|pg_current_xact_id|txid_current|"
            r"pg_xact_status|pg_current_snapshot",
            f.text,
            re.IGNORECASE,
        ):
            yield Finding(
                f.name,
                f.line_of(match.start()),
                "citus.node_local",
                f"{match.group(0)} is per node: no correctness may depend on it",
            )
        for stmt, line in f.statements:
            if type(stmt).__name__ in ("CreateStmt", "AlterTableStmt"):
                owner = known.get(_qualified(stmt.relation))
                for con, _column in _constraints(stmt):
                    if con.contype in (
                        ConstrType.CONSTR_NOTNULL,
                        ConstrType.CONSTR_NULL,
                        ConstrType.CONSTR_DEFAULT,
                    ):
                        continue
                    if not con.conname:
                        yield Finding(
                            f.name,
                            line,
                            "citus.named_constraints",
                            f"{_qualified(stmt.relation)}: every constraint needs a name",
                        )
                    if con.contype == ConstrType.CONSTR_FOREIGN:
                        if con.fk_del_action in ("n", "d") or con.fk_upd_action not in (
                            "a",
                            "r",
                            " ",
                            "",
                        ):
                            yield Finding(
                                f.name,
                                line,
                                "citus.fk_actions",
                                f"{con.conname}: only CASCADE, RESTRICT or NO ACTION on "
                                "delete, and no ON UPDATE action",
                            )
                        target = known.get(_qualified(con.pktable))
                        if (
                            owner is not None
                            and not owner.tenant
                            and target is not None
                            and target.tenant
                        ):
                            yield Finding(
                                f.name,
                                line,
                                "citus.global_references_tenant",
                                f"{owner.name} (global) references tenant table {target.name}",
                            )
            if type(stmt).__name__ == "CreateStmt":
                for elt in stmt.tableElts or ():
                    if type(elt).__name__ != "ColumnDef":
                        continue
                    type_name = _names(elt.typeName.names)[-1]
                    identity = any(
                        c.contype == ConstrType.CONSTR_IDENTITY for c in elt.constraints or ()
                    )
                    if (
                        type_name
                        in ("serial", "smallserial", "bigserial", "serial4", "serial8", "xid8")
                        or identity
                    ):
                        yield Finding(
                            f.name,
                            line,
                            "citus.serial",
                            f"{_qualified(stmt.relation)}.{elt.colname}: {type_name}"
                            f"{' identity' if identity else ''} columns do not order across nodes",
                        )
        for body, first in _bodies(f):
            for match in STATEMENT.finditer(body):
                text = match.group(0)
                line = first + body.count("\n", 0, match.start())
                touched = [t for t in tenant_names if re.search(rf"\b{re.escape(t)}\b", text)]
                if (
                    touched
                    and not TENANT_FILTER.search(text)
                    and match.group(1).lower() != "insert"
                ) and "citus.tenant_filter" not in f.allowed:
                    yield Finding(
                        f.name,
                        line,
                        "citus.tenant_filter",
                        f"a statement on {touched[0]} without tenant_id = <parameter>",
                    )
                if (
                    touched
                    and ROW_LOCK.search(text)
                    and (
                        not TENANT_FILTER.search(text)
                        or re.search(r"tenant_id\s*(=\s*any|in\s*\()", text, re.IGNORECASE)
                    )
                ) and "citus.tenant_filter" not in f.allowed:
                    yield Finding(
                        f.name, line, "citus.row_lock", "a row lock on more than one tenant"
                    )
                on_shared = any(re.search(rf"\b{re.escape(t)}\b", text) for t in shared_names)
                if on_shared and (
                    match.group(1).lower() == "update" or " returning " in text.lower()
                ):
                    clause = (
                        text
                        if match.group(1).lower() == "update"
                        else text[text.lower().index(" returning ") :]
                    )
                    found = VOLATILE.search(clause)
                    if found:
                        yield Finding(
                            f.name,
                            line,
                            "citus.volatile",
                            f"{found.group(1)}() inside UPDATE or RETURNING: compute it into a "
                            "variable first (v_now := now())",
                        )


# -- running ------------------------------------------------------------------------------


def run_sqlfluff(paths: list[Path], root: Path) -> list[Finding]:
    dialect = [] if (root / ".sqlfluff").exists() else ["--dialect", "postgres"]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sqlfluff",
            "lint",
            "--format",
            "json",
            "--nofail",
            *dialect,
            *map(str, paths),
        ],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    findings = []
    for record in json.loads(proc.stdout or "[]"):
        name = (
            str(Path(record["filepath"]).resolve().relative_to(root))
            if Path(record["filepath"]).resolve().is_relative_to(root)
            else record["filepath"]
        )
        for v in record.get("violations", []):
            findings.append(
                Finding(
                    name,
                    int(v.get("start_line_no") or 1),
                    f"sqlfluff.{v['code']}",
                    v["description"],
                )
            )
    return findings


def run_squawk(files: list[SqlFile], root: Path) -> list[Finding]:
    squawk = shutil.which("squawk") or str(Path(sys.executable).parent / "squawk")
    targets = [str(f.path) for f in files if f.name.startswith("schema/")]
    if not targets:
        return []
    if not Path(squawk).exists():
        raise FileNotFoundError("squawk is not installed: pip install 'agentkeel[lint]'")
    config = root / ".squawk.toml"
    proc = subprocess.run(
        [squawk, *(["-c", str(config)] if config.exists() else []), "--reporter", "json", *targets],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    findings = []
    for record in json.loads(proc.stdout or "[]"):
        path = Path(record["file"])
        name = (
            str(path.resolve().relative_to(root))
            if path.resolve().is_relative_to(root)
            else str(path)
        )
        findings.append(
            Finding(name, int(record["line"]), f"squawk.{record['rule_name']}", record["message"])
        )
    return findings


def lint(paths: list[Path], root: Path, *, citus: bool = True, tools: bool = True) -> list[Finding]:
    files, findings = load(paths, root)
    known = tables(files)
    findings += check_tenant_keys(files, known)
    findings += check_rls(files, known)
    findings += check_security_definer(files)
    findings += check_errcodes(files)
    findings += check_released(root)
    if citus:
        findings += check_citus(files, known)
    if tools:
        findings += run_sqlfluff(paths, root)
        findings += run_squawk(files, root)
    return sorted(set(findings))


def to_json(findings: list[Finding]) -> str:
    return json.dumps([asdict(f) for f in findings], indent=2)
