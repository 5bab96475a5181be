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
- 31 `citus.set_local_autocommit`: a SET LOCAL (or EXECUTE 'set local ...') run by the
  statement a client sent is propagated by Citus only inside a transaction block; run one
  executor level down, inside a query of another function (PERFORM keel.helper()), it is
  propagated in autocommit too (Citus treats a function call as a multi-statement
  transaction there). So a SET LOCAL is flagged in a SECURITY DEFINER function (an entry
  point) and in any function no linted function calls; a helper called by other functions
  passes. A flagged function must work in autocommit or refuse there, and says how in a
  waiver.
- 32 `citus.array_element_in_set`: an UPDATE of a tenant table whose SET takes an array
  element (v_states[i], p_ids[array_position(...)]): a Citus 13.2 worker crashed on one
  (signal 11) inside a delegated function, restarting the node for every tenant. Put the
  value in a plain variable first, or group the rows by value and update each group.
- 14 (worker side) `citus.require_tenant`: every SECURITY DEFINER function that takes
  p_tenant_id calls keel.require_tenant(p_tenant_id) before it reads or writes a table or
  calls another keel function. require_tenant verifies the caller's context and sets the
  verified tenant as SET LOCAL keel.tenant_id, the only context a worker trusts.
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
    bodies = [(f, body) for f in files for body in functions(f)]
    called = {name for _, body in bodies for name in _calls(body)}
    for f in files:
        for stmt, line in f.statements:  # migrations' own statements (rule 28)
            if kind(stmt) != "CreateFunctionStmt":
                yield from _insert_select(f, BodyStatement("sql", "", line, stmt), set(), known)
    for f, body in bodies:
        for statement in body.statements:
            yield from _insert_select(f, statement, body.variables, known)
            yield from _array_element_in_set(f, statement, known)
        yield from _definer_result(f, body, tenant_names)
        if f.name.startswith("functions/"):
            yield from _delegation(f, body, known)
        yield from _set_local(f, body, called)
        yield from _require_tenant(f, body)


def _function_calls(node: Any) -> Iterator[str]:
    for n in walk(node):
        if kind(n) == "FuncCall":
            yield ".".join(getattr(part, "sval", "") for part in n.funcname or ())


def _calls(body: FunctionBody) -> set[str]:
    """The keel functions a body calls (the regex fallback: every keel.name( it mentions)."""
    found: set[str] = set()
    for statement in body.statements:
        if statement.node is None:
            found.update(m.lower() for m in re.findall(r"\bkeel\.\w+(?=\s*\()", statement.sql))
        found.update(n for n in _function_calls(statement.node) if n.startswith("keel."))
    return found


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


def _array_element_in_set(
    f: SqlFile, statement: BodyStatement, known: dict[str, Table]
) -> Iterator[Finding]:
    if "citus.array_element_in_set" in f.allowed:
        return
    node = statement.node
    if node is None:  # the regex fallback
        text = statement.sql.lower()
        target = re.match(r"\s*update\s+([\w.]+)", text)
        table = known.get(target.group(1)) if target else None
        head = re.split(r"\bwhere\b", text, maxsplit=1)[0]
        if table is not None and table.tenant and re.search(r"\bset\b[\s\S]*\w\[", head):
            yield _array_element_finding(f, statement.line, table.name)
        return
    if kind(node) != "UpdateStmt":
        return
    table = known.get(qualified(node.relation))
    if table is None or not table.tenant:
        return
    for target in node.targetList or ():
        if any(
            kind(n) == "A_Indirection" and any(kind(i) == "A_Indices" for i in n.indirection)
            for n in walk(target.val)
        ):
            yield _array_element_finding(f, statement.line, table.name)
            return


def _array_element_finding(f: SqlFile, line: int, table: str) -> Finding:
    return Finding(
        f.name,
        line,
        "citus.array_element_in_set",
        f"UPDATE of {table} takes an array element in its SET: a Citus 13.2 worker crashed"
        " on one (signal 11), restarting the node",
        "put the value in a plain variable first, or update each group of rows that take"
        " one value (keel.transition_tasks)",
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
                "API functions are PL/pgSQL with p_tenant_id uuid first (docs/citus.md)",
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


def _set_local(f: SqlFile, body: FunctionBody, called: set[str]) -> Iterator[Finding]:
    if "citus.set_local_autocommit" in f.allowed:
        return
    if not body.security_definer and body.name in called:
        return  # a helper: it runs inside its caller's query, where Citus propagates
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
                "call a helper that sets it (PERFORM keel.require_tenant(p_tenant_id) sets the "
                "tenant context), refuse outside a transaction block, or say how it copes in "
                "`-- agentkeel:allow citus.set_local_autocommit (why)`",
            )
            return


REQUIRE_TENANT = "keel.require_tenant"


def _require_tenant(f: SqlFile, body: FunctionBody) -> Iterator[Finding]:
    if not body.security_definer or "citus.require_tenant" in f.allowed:
        return
    if DELEGATION_ARGUMENT not in dict(body.parameters):
        return
    for statement in body.statements:
        node = statement.node
        if node is None:
            text = statement.sql.lower()
            if re.search(rf"\b{re.escape(REQUIRE_TENANT)}\s*\(\s*{DELEGATION_ARGUMENT}\b", text):
                return
            early = bool(re.search(r"\bkeel\.\w+", text))
        else:
            for call in walk(node):
                if (
                    kind(call) == "FuncCall"
                    and ".".join(getattr(p, "sval", "") for p in call.funcname or ())
                    == REQUIRE_TENANT
                    and any(
                        kind(a) == "ColumnRef"
                        and [getattr(x, "sval", None) for x in a.fields] == [DELEGATION_ARGUMENT]
                        for a in call.args or ()
                    )
                ):
                    return
            early = bool(relations(node)) or any(
                name.startswith("keel.") for name in _function_calls(node)
            )
        if early:
            yield _require_tenant_finding(f, statement.line, body.name, "before it")
            return
    yield _require_tenant_finding(f, body.line, body.name, "without")


def _require_tenant_finding(f: SqlFile, line: int, name: str, where: str) -> Finding:
    said = "reaches keel objects before it calls" if where == "before it" else "never calls"
    return Finding(
        f.name,
        line,
        "citus.require_tenant",
        f"{name} is SECURITY DEFINER, takes {DELEGATION_ARGUMENT} and {said} "
        f"{REQUIRE_TENANT}({DELEGATION_ARGUMENT}): the caller's context is not verified first, "
        "and a worker node never sees the verified tenant",
        f"begin the body with PERFORM {REQUIRE_TENANT}({DELEGATION_ARGUMENT})",
    )
