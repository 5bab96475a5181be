"""The citus family: the rules of CITUS.md §(c) that can be decided from the files."""

from __future__ import annotations

import re
from collections.abc import Iterator

from pglast.enums import ConstrType

from agentkeel.distribute import CITUS_DIR, LOCAL_TABLES
from agentkeel.lint.core import (
    Finding,
    SqlFile,
    Table,
    constraints,
    kind,
    names,
    qualified,
    relations,
)
from agentkeel.lint.plpgsql import BodyStatement, fallback_findings, functions

TENANT_FILTER = re.compile(r"tenant_id\s*=\s*[pv]_\w+|tenant_id\s*=\s*\(?[pv]_", re.IGNORECASE)
ROW_LOCK = re.compile(
    r"\bfor\s+(update|no\s+key\s+update|share|key\s+share)\b|skip\s+locked|nowait", re.I
)
VOLATILE = re.compile(
    r"\b(now|clock_timestamp|statement_timestamp|random|gen_random_uuid|"
    r"current_setting|nextval|uuid_generate_\w+)\s*\(",
    re.IGNORECASE,
)


def check_citus(files: list[SqlFile], known: dict[str, Table]) -> Iterator[Finding]:
    tenant_names = {t.name for t in known.values() if t.tenant}
    shared_names = {t.name for t in known.values() if t.name not in LOCAL_TABLES}
    for f in files:
        for match in re.finditer(r"set_config\s*\(\s*'keel\.", f.text, re.IGNORECASE):
            if _replaced_on_citus(f):
                continue
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
            if kind(stmt) in ("CreateStmt", "AlterTableStmt"):
                owner = known.get(qualified(stmt.relation))
                for con, _column in constraints(stmt):
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
                            f"{qualified(stmt.relation)}: every constraint needs a name",
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
                        target = known.get(qualified(con.pktable))
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
            if kind(stmt) == "CreateStmt":
                for elt in stmt.tableElts or ():
                    if kind(elt) != "ColumnDef":
                        continue
                    type_name = names(elt.typeName.names)[-1]
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
                            f"{qualified(stmt.relation)}.{elt.colname}: {type_name}"
                            f"{' identity' if identity else ''} columns do not order across nodes",
                        )
        bodies = list(functions(f))
        yield from fallback_findings(f, bodies)
        for body in bodies:
            for statement in body.statements:
                yield from _statement_rules(f, statement, tenant_names, shared_names)


def _replaced_on_citus(f: SqlFile) -> bool:
    """A shipped function file that `agentkeel distribute` replaces on Citus by the
    variant of the same name in tools/agentkeel/citus (which itself must pass)."""
    variant = CITUS_DIR / f.path.name
    return (
        f.path.parent.name == "functions"
        and f.path.resolve() != variant.resolve()
        and variant.is_file()
    )


def _statement_rules(
    f: SqlFile, statement: BodyStatement, tenant_names: set[str], shared_names: set[str]
) -> Iterator[Finding]:
    """Rules 14-16 and 18 (CITUS.md §(c)) on one statement of a function body."""
    text, line = statement.sql, statement.line
    first = re.match(r"\s*(\w+)", text)
    verb = first.group(1).lower() if first else ""
    if statement.node is not None:
        mentioned = relations(statement.node)
    else:  # the regex fallback: any mention of the name
        mentioned = {
            t for t in tenant_names | shared_names if re.search(rf"\b{re.escape(t)}\b", text)
        }
    touched = sorted(mentioned & tenant_names)
    if (
        touched and not TENANT_FILTER.search(text) and verb != "insert"
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
        yield Finding(f.name, line, "citus.row_lock", "a row lock on more than one tenant")
    on_shared = bool(mentioned & shared_names)
    returning = re.search(r"\breturning\b", text, re.IGNORECASE)
    if on_shared and (verb == "update" or returning):
        clause = text if verb == "update" or returning is None else text[returning.start() :]
        found = VOLATILE.search(clause)
        if found:
            yield Finding(
                f.name,
                line,
                "citus.volatile",
                f"{found.group(1)}() inside UPDATE or RETURNING: compute it into a "
                "variable first (v_now := now())",
            )
