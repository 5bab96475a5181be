"""tenant_keys: keys and foreign keys of tenant tables carry tenant_id."""

from __future__ import annotations

from collections.abc import Iterator

from pglast.enums import ConstrType

from agentkeel.lint.core import (
    TENANT_COLUMN,
    Finding,
    SqlFile,
    Table,
    constraints,
    kind,
    names,
    qualified,
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
