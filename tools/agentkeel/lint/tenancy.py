"""tenancy: every keel table is a tenant table or declared global; tenant_keys: the keys
and foreign keys of tenant tables carry tenant_id."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from pglast import parse_sql
from pglast.enums import ConstrType
from pglast.parser import ParseError

from agentkeel.lint.core import (
    TENANT_COLUMN,
    Finding,
    SqlFile,
    Table,
    constraints,
    kind,
    names,
    qualified,
    walk,
)


def check_tenant_keys(files: list[SqlFile], known: dict[str, Table]) -> Iterator[Finding]:
    for f in files:
        for stmt, line in f.statements:
            stmt_kind = kind(stmt)
            if stmt_kind in ("CreateStmt", "AlterTableStmt"):
                table = known.get(qualified(stmt.relation))
                if table is None or not table.tenant:
                    continue
                for con, column in constraints(stmt):
                    keys = [column] if column else names(con.keys)
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
                        local = [column] if column else names(con.fk_attrs)
                        target = known.get(qualified(con.pktable))
                        remote = names(con.pk_attrs)
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
            elif stmt_kind == "IndexStmt" and stmt.unique:
                table = known.get(qualified(stmt.relation))
                cols = [p.name for p in stmt.indexParams or ()]
                if table is not None and table.tenant and TENANT_COLUMN not in cols:
                    yield Finding(
                        f.name,
                        line,
                        "tenant_keys",
                        f"{table.name}: unique index {stmt.idxname} does not include tenant_id",
                    )


GLOBAL_TABLES_FILE = "functions/global_tables.sql"
GLOBAL_TABLES_FUNCTION = "keel.global_tables"


def global_tables(files: list[SqlFile], root: Path) -> set[str] | None:
    """The names keel.global_tables() returns, read with pglast from its file (one of the
    linted files, else root/functions/global_tables.sql); None when there is none."""
    statements = [stmt for f in files for stmt, _ in f.statements]
    path = root / GLOBAL_TABLES_FILE
    if not any(_is_global_tables(s) for s in statements) and path.is_file():
        try:
            statements = [raw.stmt for raw in parse_sql(path.read_text(encoding="utf-8"))]
        except ParseError:
            return None
    for stmt in statements:
        if _is_global_tables(stmt):
            body = next((o.arg[0].sval for o in stmt.options or () if o.defname == "as"), None)
            nodes = parse_sql(body) if body is not None else stmt.sql_body
            return {n.sval for n in walk(nodes) if kind(n) == "String" and "." in n.sval}
    return None


def _is_global_tables(stmt: object) -> bool:
    return (
        kind(stmt) == "CreateFunctionStmt"
        and ".".join(names(getattr(stmt, "funcname", ()))) == GLOBAL_TABLES_FUNCTION
    )


def check_tenancy(
    files: list[SqlFile], known: dict[str, Table], declared: set[str] | None
) -> Iterator[Finding]:
    """Every table created in keel is a tenant table (tenant_id uuid not null) or is named
    by keel.global_tables(); a table listed there has no tenant_id."""
    linted = {f.name for f in files}
    for table in known.values():
        if not table.name.startswith("keel.") or table.file.name not in linted:
            continue
        column = table.column_defs.get(TENANT_COLUMN)
        if column is not None:
            type_name = [n for n in names(column.typeName.names) if n != "pg_catalog"]
            not_null = any(
                c.contype in (ConstrType.CONSTR_NOTNULL, ConstrType.CONSTR_PRIMARY)
                for c in column.constraints or ()
            )
            if type_name != ["uuid"] or not not_null:
                yield Finding(
                    table.file.name,
                    table.line,
                    "tenancy",
                    f"{table.name}.tenant_id must be uuid not null",
                    "declare it `tenant_id uuid not null`",
                )
            if declared is not None and table.name in declared:
                yield Finding(
                    table.file.name,
                    table.line,
                    "tenancy",
                    f"{table.name} has tenant_id but keel.global_tables() lists it as global",
                    f"remove it from {GLOBAL_TABLES_FILE}",
                )
        elif declared is None:
            yield Finding(
                table.file.name,
                table.line,
                "tenancy",
                f"{table.name} has no tenant_id, and there is no keel.global_tables() "
                f"({GLOBAL_TABLES_FILE}) to declare it global",
                f"create {GLOBAL_TABLES_FILE}, listing the global tables",
            )
        elif table.name not in declared:
            yield Finding(
                table.file.name,
                table.line,
                "tenancy",
                f"{table.name} has no tenant_id and is not declared global: every keel table "
                "is a tenant table or is listed by keel.global_tables()",
                "add tenant_id uuid not null (first in every key, with row-level security), "
                f"or add '{table.name}' to {GLOBAL_TABLES_FILE}",
            )
