"""The Citus distribution step (CITUS.md §(a) item 26), generated from the catalog so
that a new table or function cannot be forgotten. Unverified on a live Citus cluster."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import psycopg

# Plain tables that stay on every node: read inside RLS policies (keys) or by the migrator.
LOCAL_TABLES = ("keel.migration_history", "keel.tenant_token_keys")
# Functions replaced on Citus by a variant shipped here (CITUS.md (b)): same signature.
CITUS_DIR = Path(__file__).resolve().parent / "citus"
CITUS_VARIANTS = sorted(CITUS_DIR.glob("*.sql"))
# Roles that set the tenant context with SET LOCAL: it must reach the shard's node.
CONTEXT_ROLES = ("keel_app", "keel_worker", "keel_agent", "keel_owner")


@dataclass(frozen=True)
class Layout:
    tenant_tables: list[str]
    reference_tables: list[str]
    local_tables: list[str]
    triggered: set[str]
    foreign_keys: list[tuple[str, str, str]]  # table, constraint, definition
    api_functions: list[str]  # regprocedure text of functions taking p_tenant_id


def read_layout(conn: psycopg.Connection) -> Layout:
    tables = conn.execute(
        "select c.oid::regclass::text, c.oid in (select keel.tenant_tables())"
        " from pg_class c join pg_namespace n on n.oid = c.relnamespace"
        " where n.nspname = 'keel' and c.relkind in ('r', 'p') and not c.relispartition"
        " order by 1"
    ).fetchall()
    triggered = {
        r[0]
        for r in conn.execute(
            "select distinct tgrelid::regclass::text from pg_trigger t"
            " join pg_class c on c.oid = t.tgrelid join pg_namespace n on n.oid = c.relnamespace"
            " where n.nspname = 'keel' and not t.tgisinternal"
        )
    }
    fks = conn.execute(
        "select k.conrelid::regclass::text, k.conname, pg_get_constraintdef(k.oid)"
        " from pg_constraint k join pg_class c on c.oid = k.conrelid"
        " join pg_namespace n on n.oid = c.relnamespace"
        " where n.nspname = 'keel' and k.contype = 'f' order by 1, 2"
    ).fetchall()
    functions = [
        r[0]
        for r in conn.execute(
            "select p.oid::regprocedure::text from pg_proc p"
            " join pg_namespace n on n.oid = p.pronamespace"
            " where n.nspname = 'keel' and 'p_tenant_id' = any(p.proargnames) order by 1"
        )
    ]
    tenant = [name for name, has_tenant in tables if has_tenant]
    local = [name for name, _ in tables if name in LOCAL_TABLES]
    reference = [name for name, has_tenant in tables if not has_tenant and name not in LOCAL_TABLES]
    if "keel.tenants" in tenant:  # distributed first: every other table colocates with it
        tenant.remove("keel.tenants")
        tenant.insert(0, "keel.tenants")
    return Layout(tenant, reference, local, triggered, fks, functions)


def script(layout: Layout) -> str:
    """The distribution step as SQL, one statement per line, in the order Citus needs."""
    q = "'"
    out = [
        "-- agentkeel: distribute the keel schema by tenant_id on Citus.",
        "-- Generated from the catalog; UNVERIFIED on a live Citus cluster. Run as a superuser",
        "-- (or the owner) on the coordinator, after `create extension citus` on every node.",
        "",
        "-- 1. Save and drop the foreign keys (an existing FK graph cannot be distributed).",
    ]
    out += [f"alter table {t} drop constraint {c};" for t, c, _ in layout.foreign_keys]
    out += ["", "-- 2. Global tables become reference tables (a copy on every node)."]
    out += [f"select create_reference_table({q}{t}{q});" for t in layout.reference_tables]
    out += [
        "",
        "-- 3. and 4. Tenant tables are distributed by tenant_id, colocated with keel.tenants.",
    ]
    if layout.triggered & set(layout.tenant_tables):
        out.append("set citus.enable_unsafe_triggers = on;")
    for t in layout.tenant_tables:
        if t == "keel.tenants":
            out.append(f"select create_distributed_table({q}{t}{q}, {q}tenant_id{q});")
        else:
            out.append(
                f"select create_distributed_table({q}{t}{q}, {q}tenant_id{q},"
                f" colocate_with => {q}keel.tenants{q});"
            )
    out += ["", "-- 5. Re-add the foreign keys, sequentially."]
    out.append("set citus.multi_shard_modify_mode to 'sequential';")
    out += [f"alter table {t} add constraint {c} {d};" for t, c, d in layout.foreign_keys]
    out.append("reset citus.multi_shard_modify_mode;")
    out += ["", "-- 6. API functions run on the node that holds their tenant."]
    out += [
        f"select create_distributed_function({q}{f}{q}::regprocedure, {q}p_tenant_id{q},"
        f" colocate_with := {q}keel.tasks{q});"
        for f in layout.api_functions
    ]
    out += ["", "-- 7. SET LOCAL keel.tenant_id / keel.tenant_token must reach the workers."]
    out += [f"alter role {r} set citus.propagate_set_commands = 'local';" for r in CONTEXT_ROLES]
    out += [
        "",
        "-- 8. SECURITY DEFINER functions connect to the workers as their owner: keel_owner",
        "-- must be able to log in and authenticate to every node (set a password or",
        "-- certificate and pg_hba entries, then uncomment).",
        "-- alter role keel_owner login;",
        "",
        "-- Plain tables that stay on every node; copy their rows to each worker, and again",
        "-- whenever a worker is added:",
    ]
    out += [f"--   {t}" for t in layout.local_tables]
    return "\n".join(out) + "\n"


def statements(text: str) -> list[str]:
    """The executable lines of a script (comments dropped)."""
    return [line for line in text.splitlines() if line.strip() and not line.startswith("--")]


def citus_installed(conn: psycopg.Connection) -> bool:
    row = conn.execute(
        "select exists (select 1 from pg_extension where extname = 'citus')"
    ).fetchone()
    return bool(row and row[0])
