"""CITUS.md §(c) rules 28-31: what failed on a real Citus cluster, as far as the files show it.

- 28 `citus.insert_select`: INSERT ... SELECT into a tenant (distributed) table that does
  not read a colocated table filtered by one tenant. Citus pulls such rows to the
  coordinator and ships them with COPY, which row-level security refuses.
- 29 `citus.definer_result`: a SECURITY DEFINER function that writes a tenant table and
  returns nothing, so its caller has to read the rows back, and on Citus may not
  (placements modified by a different user in this transaction). Only the function's
  shape can be checked; whether a client reads the rows back is not in the files.
- 30 `citus.delegation` / `citus.worker_tables`: distribute delegates a function to its
  tenant's node by the argument `p_tenant_id` (uuid, first, PL/pgSQL); a tenant argument
  spelled otherwise is never delegated, and a delegated function may only touch tables
  that exist on the workers (created by a migration, so distributed or replicated).
  Whether every helper function is propagated to the workers is decided by
  tools/agentkeel/distribute.py from the catalog, not by the SQL files.
- 31 `citus.set_local_autocommit`: a function that runs SET LOCAL itself (EXECUTE 'set
  local ...') relies on a setting Citus propagates only inside a transaction block. It
  must work in autocommit or refuse there; the files cannot show which, so each such
  function carries a waiver that says how it copes.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from pglast.enums import A_Expr_Kind

from agentkeel.lint.core import (
    TENANT_COLUMN,
    Finding,
    SqlFile,
    Table,
    kind,
    qualified,
    relations,
    walk,
)
from agentkeel.lint.plpgsql import BodyStatement, FunctionBody, functions

DELEGATION_ARGUMENT = "p_tenant_id"  # what agentkeel distribute delegates by
WRITES = ("InsertStmt", "UpdateStmt", "DeleteStmt")


def check_cluster(files: list[SqlFile], known: dict[str, Table]) -> Iterator[Finding]:
    tenant_names = {t.name for t in known.values() if t.tenant}
    for f in files:
        for stmt, line in f.statements:  # migrations' own statements (rule 28)
            if kind(stmt) != "CreateFunctionStmt":
                yield from _insert_select(f, BodyStatement("sql", "", line, stmt), set(), known)
        for body in functions(f):
            for statement in body.statements:
                yield from _insert_select(f, statement, body.variables, known)
            yield from _definer_result(f, body, tenant_names)
            if f.name.startswith("functions/"):
                yield from _delegation(f, body, known)
            yield from _set_local(f, body)


def _is_variable(node: Any, variables: set[str]) -> bool:
    """A parameter, a PL/pgSQL variable or a field of one (v_task.tenant_id)."""
    if kind(node) == "ParamRef":
        return True
    if kind(node) != "ColumnRef":
        return False
    fields = [getattr(n, "sval", None) for n in node.fields or ()]
    return bool(fields) and fields[0] in variables


def _single_tenant_filter(where: Any, variables: set[str]) -> bool:
    for node in walk(where):
        if kind(node) != "A_Expr" or node.kind != A_Expr_Kind.AEXPR_OP:  # not = ANY (...)
            continue
        if [n.sval for n in node.name or ()] != ["="]:
            continue
        sides = (node.lexpr, node.rexpr)
        for column, value in (sides, sides[::-1]):
            if (
                kind(column) == "ColumnRef"
                and [getattr(n, "sval", None) for n in column.fields][-1:] == [TENANT_COLUMN]
                and _is_variable(value, variables)
            ):
                return True
    return False


def _from_items(items: Any) -> Iterator[Any]:
    for item in items or ():
        if kind(item) == "JoinExpr":
            yield from _from_items((item.larg, item.rarg))
        else:
            yield item


def _insert_select(
    f: SqlFile, statement: BodyStatement, variables: set[str], known: dict[str, Table]
) -> Iterator[Finding]:
    if "citus.insert_select" in f.allowed:
        return
    node = statement.node
    if node is None:  # the regex fallback
        text = statement.sql.lower()
        target = re.match(r"\s*insert\s+into\s+([\w.]+)", text)
        table = known.get(target.group(1)) if target else None
        if (
            table is not None
            and table.tenant
            and re.search(r"\bselect\b", text)
            and not re.search(r"\bvalues\b", text)
        ):
            yield _insert_select_finding(f, statement.line, table.name, "a SELECT")
        return
    if kind(node) != "InsertStmt" or node.selectStmt is None:
        return
    table = known.get(qualified(node.relation))
    select = node.selectStmt
    if table is None or not table.tenant or select.valuesLists:
        return
    if select.op is not None and select.op.name != "SETOP_NONE":
        yield _insert_select_finding(f, statement.line, table.name, "a set operation")
        return
    items = list(_from_items(select.fromClause))
    if not items:
        yield _insert_select_finding(f, statement.line, table.name, "a SELECT without FROM")
        return
    for item in items:
        if kind(item) != "RangeVar":
            source = {"RangeFunction": "a set-returning function", "RangeSubselect": "a subquery"}
            what = source.get(kind(item), kind(item))
            yield _insert_select_finding(f, statement.line, table.name, what)
            return
        read = known.get(qualified(item))
        if read is None or not read.tenant:
            yield _insert_select_finding(
                f, statement.line, table.name, f"{qualified(item)}, which is not colocated"
            )
            return
    if not _single_tenant_filter(select.whereClause, variables):
        yield _insert_select_finding(
            f, statement.line, table.name, "tenant tables not filtered by one tenant_id"
        )


def _insert_select_finding(f: SqlFile, line: int, table: str, source: str) -> Finding:
    return Finding(
        f.name,
        line,
        "citus.insert_select",
        f"INSERT ... SELECT into {table} from {source}: Citus pulls the rows to the "
        "coordinator and COPYs them, which row-level security refuses",
        "insert the computed rows one at a time (a loop of single-row INSERT ... VALUES "
        "with PL/pgSQL variables)",
    )


def _definer_result(f: SqlFile, body: FunctionBody, tenant_names: set[str]) -> Iterator[Finding]:
    if not body.security_definer or body.returns not in ("void", "pg_catalog.void"):
        return
    if "citus.definer_result" in f.allowed:
        return
    for statement in body.statements:
        node = statement.node
        if kind(node) in WRITES and qualified(node.relation) in tenant_names:
            yield Finding(
                f.name,
                body.line,
                "citus.definer_result",
                f"{body.name} is SECURITY DEFINER, writes {qualified(node.relation)} and returns "
                "nothing: on Citus its caller may not read those rows in the same transaction",
                "return the written row(s) from the function",
            )
            return


def _delegation(f: SqlFile, body: FunctionBody, known: dict[str, Table]) -> Iterator[Finding]:
    parameters = body.parameters
    arguments = [name for name, _ in parameters]
    if DELEGATION_ARGUMENT in arguments:
        problems = []
        if arguments[0] != DELEGATION_ARGUMENT:
            problems.append("is not the first argument")
        if dict(parameters)[DELEGATION_ARGUMENT] != "uuid":
            problems.append("is not uuid")
        if body.language != "plpgsql":
            problems.append(f"belongs to a {body.language} function (inlined, never delegated)")
        if problems and "citus.delegation" not in f.allowed:
            yield Finding(
                f.name,
                body.line,
                "citus.delegation",
                f"{body.name}: {DELEGATION_ARGUMENT} " + " and ".join(problems),
                "API functions are PL/pgSQL with p_tenant_id uuid first (CITUS.md rule 23)",
            )
        if "keel.tenants" in known and "citus.worker_tables" not in f.allowed:
            for statement in body.statements:
                missing = sorted(
                    name
                    for name in relations(statement.node)
                    if name.startswith("keel.") and name not in known
                )
                if missing:
                    yield Finding(
                        f.name,
                        statement.line,
                        "citus.worker_tables",
                        f"{body.name} runs on its tenant's node but reads {missing[0]}, which "
                        "no migration creates, so it is on no worker",
                        "keep coordinator-only work out of functions that take p_tenant_id",
                    )
        return
    for name, type_name in parameters:
        if type_name == "uuid" and "tenant" in name and "citus.delegation" not in f.allowed:
            yield Finding(
                f.name,
                body.line,
                "citus.delegation",
                f"{body.name} takes the tenant as {name}: agentkeel distribute delegates by "
                f"{DELEGATION_ARGUMENT}, so this function never runs on its tenant's node",
                f"name the argument {DELEGATION_ARGUMENT} and put it first",
            )


def _set_local(f: SqlFile, body: FunctionBody) -> Iterator[Finding]:
    if "citus.set_local_autocommit" in f.allowed:
        return
    for statement in body.statements:
        node = statement.node
        local = kind(node) == "VariableSetStmt" and bool(node.is_local)
        if statement.plpgsql == "dynexecute":
            local = any(
                kind(n) == "String" and n.sval.lstrip().lower().startswith("set local")
                for n in walk(node)
            ) or (node is None and "set local" in statement.sql.lower())
        if local:
            yield Finding(
                f.name,
                statement.line,
                "citus.set_local_autocommit",
                f"{body.name} runs SET LOCAL itself: Citus propagates it only inside a "
                "transaction block, so in autocommit the function must work without it or "
                "refuse, never return an empty result",
                "refuse outside a transaction block, or say how it copes in "
                "`-- agentkeel:allow citus.set_local_autocommit (why)`",
            )
            return
