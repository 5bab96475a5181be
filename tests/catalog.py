"""A comparable snapshot of everything agentkeel owns in the catalog: tables, columns,
constraints, indexes, policies, triggers, grants, functions and comments of schema keel.
Two databases built differently (all at once, re-applied, upgraded) must give equal
snapshots (G12)."""

from __future__ import annotations

from typing import Any

import psycopg

QUERIES: dict[str, str] = {
    "columns": """
        select c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
               pg_get_expr(d.adbin, d.adrelid)
        from pg_attribute a
        join pg_class c on c.oid = a.attrelid
        join pg_namespace n on n.oid = c.relnamespace
        left join pg_attrdef d on d.adrelid = a.attrelid and d.adnum = a.attnum
        where n.nspname = 'keel' and a.attnum > 0 and not a.attisdropped
          and c.relkind in ('r', 'p', 'v', 'm')
    """,
    "tables": """
        select c.relname, c.relkind, c.relrowsecurity, c.relforcerowsecurity,
               coalesce(c.reloptions, '{}'), pg_get_userbyid(c.relowner)
        from pg_class c join pg_namespace n on n.oid = c.relnamespace
        where n.nspname = 'keel' and c.relkind in ('r', 'p', 'v', 'm', 'S')
    """,
    "constraints": """
        select c.relname, k.conname, pg_get_constraintdef(k.oid)
        from pg_constraint k join pg_class c on c.oid = k.conrelid
        join pg_namespace n on n.oid = c.relnamespace where n.nspname = 'keel'
    """,
    "indexes": """
        select i.indrelid::regclass::text, pg_get_indexdef(i.indexrelid)
        from pg_index i join pg_class c on c.oid = i.indexrelid
        join pg_namespace n on n.oid = c.relnamespace where n.nspname = 'keel'
    """,
    "policies": """
        select tablename, policyname, permissive, roles::text, cmd, qual, with_check
        from pg_policies where schemaname = 'keel'
    """,
    "triggers": """
        select tgrelid::regclass::text, tgname, pg_get_triggerdef(t.oid), tgenabled
        from pg_trigger t join pg_class c on c.oid = t.tgrelid
        join pg_namespace n on n.oid = c.relnamespace
        where n.nspname = 'keel' and not t.tgisinternal
    """,
    "table_grants": """
        select c.relname, coalesce(r.rolname, 'PUBLIC'), acl.privilege_type
        from pg_class c join pg_namespace n on n.oid = c.relnamespace
        cross join lateral aclexplode(c.relacl) acl
        left join pg_roles r on r.oid = acl.grantee
        where n.nspname = 'keel'
    """,
    "functions": """
        select p.oid::regprocedure::text, pg_get_function_result(p.oid), p.prosecdef,
               p.provolatile, coalesce(p.proconfig, '{}'), md5(pg_get_functiondef(p.oid)),
               pg_get_userbyid(p.proowner), coalesce(p.proacl::text[], '{}')
        from pg_proc p join pg_namespace n on n.oid = p.pronamespace
        where n.nspname = 'keel'
    """,
    "comments": """
        select d.classoid::regclass::text, d.objsubid,
               coalesce(c.relname, p.oid::regprocedure::text, n2.nspname), d.description
        from pg_description d
        left join pg_class c on d.classoid = 'pg_class'::regclass and c.oid = d.objoid
        left join pg_proc p on d.classoid = 'pg_proc'::regclass and p.oid = d.objoid
        left join pg_namespace n2 on d.classoid = 'pg_namespace'::regclass and n2.oid = d.objoid
        where coalesce(c.relnamespace, p.pronamespace, n2.oid) = 'keel'::regnamespace
    """,
}


def snapshot(conn: psycopg.Connection) -> dict[str, list[tuple[Any, ...]]]:
    """Each part of the catalog as a sorted list of rows."""
    return {
        name: sorted(
            (
                tuple(tuple(v) if isinstance(v, list) else v for v in row)
                for row in conn.execute(query.encode()).fetchall()
            ),
            key=repr,
        )
        for name, query in QUERIES.items()
    }


def differences(
    a: dict[str, list[tuple[Any, ...]]], b: dict[str, list[tuple[Any, ...]]]
) -> list[str]:
    """Human-readable differences between two snapshots (empty when equal)."""
    found = []
    for part in QUERIES:
        left, right = set(a.get(part, [])), set(b.get(part, []))
        found += [f"{part}: only in the first: {row}" for row in sorted(left - right, key=repr)]
        found += [f"{part}: only in the second: {row}" for row in sorted(right - left, key=repr)]
    return found
