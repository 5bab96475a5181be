"""The Citus distribution step (CITUS.md §(a) item 26, and what a real cluster showed
was missing: issue 9), generated from the catalog so that no table or function, including
ones other releases add, can be forgotten.

`read_layout` reads the catalog (and, where Citus is installed, what is already
distributed); `plan` is pure: catalog rows in, steps out, so a second run plans nothing
for what the first one did and says so. `script` prints the plan; the CLI's `--apply`
runs every step in one transaction. Unverified on a live Citus cluster: Citus cannot run
where this is developed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from pglast import split

# Plain tables that stay per node: read inside RLS policies (keys) or by the migrator.
LOCAL_TABLES = ("keel.migration_history", "keel.tenant_token_keys")
# The signing keys a node needs to verify an agent's token: copied to every worker.
KEYS_TABLE = "keel.tenant_token_keys"
# Functions replaced on Citus by a variant shipped here (CITUS.md (b)): same signature.
CITUS_DIR = Path(__file__).resolve().parent / "citus"
CITUS_VARIANTS = sorted(CITUS_DIR.glob("*.sql"))
# The comment every variant's function carries, so a run can tell it is installed.
VARIANT_MARK = "Citus variant"
# The role that owns the definer functions: Citus opens worker connections as it.
OWNER = "keel_owner"
DISTRIBUTION_ARGUMENT = "p_tenant_id"
COLOCATE_WITH = "keel.tenants"
# The digest of the keys on a node, to tell whether a worker's copy is current.
KEYS_DIGEST = (
    "select coalesce(string_agg(k.key_version::text || ':' || coalesce(k.retired_at::text, '')"
    " || ':' || md5(k.inner_key || k.outer_key), ',' order by k.key_version), '')"
    " from keel.tenant_token_keys as k"
)
# The keys table as every node has it: schema/0010_tenant_token_keys.sql's definition.
KEYS_DDL = (
    "create table if not exists keel.tenant_token_keys ("
    " key_version integer not null, inner_key bytea not null, outer_key bytea not null,"
    " created_at timestamptz not null default now(), retired_at timestamptz,"
    " constraint tenant_token_keys_pkey primary key (key_version),"
    " constraint tenant_token_keys_key_version_check check (key_version > 0),"
    " constraint tenant_token_keys_inner_key_check check (octet_length(inner_key) = 64),"
    " constraint tenant_token_keys_outer_key_check check (octet_length(outer_key) = 64))"
)


@dataclass(frozen=True)
class Variant:
    function: str  # regprocedure text, e.g. keel.claim_next_task(text,interval,text)
    path: Path

    @property
    def statements(self) -> list[str]:
        return [s.strip() for s in split(self.path.read_text(), with_parser=True) if s.strip()]


@dataclass(frozen=True)
class Layout:
    """What the planner needs, as plain data (catalog rows)."""

    tenant_tables: list[str]
    reference_tables: list[str]
    local_tables: list[str]
    triggered: set[str]
    foreign_keys: list[tuple[str, str, str]]  # table, constraint, definition
    api_functions: list[str]  # regprocedure text of functions taking p_tenant_id
    helper_functions: list[str] = field(default_factory=list)  # every other keel function
    database: str = ""
    # What a run before this one already did (empty where Citus is not installed):
    distributed_tables: frozenset[str] = frozenset()  # pg_dist_partition
    distributed_functions: frozenset[str] = frozenset()  # pg_dist_object
    installed_variants: frozenset[str] = frozenset()  # functions carrying VARIANT_MARK
    owner_can_login: bool = False
    database_propagates_set_local: bool = False  # ALTER DATABASE ... SET done
    keys_digest: str = ""  # the coordinator's keys
    # each worker's keys (None: no table there); None: unknown, Citus is not installed
    worker_keys_digests: tuple[str | None, ...] | None = None
    variants: tuple[Variant, ...] = ()


@dataclass(frozen=True)
class Step:
    title: str  # what it does, printed as a comment
    statements: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # what the DBA must do by hand, printed as comments


def variants() -> tuple[Variant, ...]:
    """The shipped Citus variants, by the function each replaces (named in its comment)."""
    found = []
    for path in CITUS_VARIANTS:
        for stmt in split(path.read_text(), with_parser=True):
            words = stmt.split()
            if words[:3] == ["comment", "on", "function"]:
                signature = stmt.split(" is", 1)[0].removeprefix("comment on function").strip()
                found.append(Variant(signature.replace(", ", ","), path))
    return tuple(found)


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
    functions = conn.execute(
        "select p.oid::regprocedure::text, %s = any(coalesce(p.proargnames, '{}')),"
        " coalesce(obj_description(p.oid, 'pg_proc'), '') like %s"
        " from pg_proc p join pg_namespace n on n.oid = p.pronamespace"
        " where n.nspname = 'keel' and p.prokind = 'f' order by 1",
        (DISTRIBUTION_ARGUMENT, VARIANT_MARK + "%"),
    ).fetchall()
    row = conn.execute(
        "select current_database(),"
        " coalesce((select rolcanlogin from pg_roles where rolname = %s), false),"
        " exists (select 1 from pg_db_role_setting s join pg_database d on d.oid = s.setdatabase"
        "  where d.datname = current_database() and s.setrole = 0"
        "  and 'citus.propagate_set_commands=local' = any(s.setconfig)),"
        " to_regclass(%s) is not null",
        (OWNER, KEYS_TABLE),
    ).fetchone()
    assert row is not None
    database, owner_login, propagates, has_keys = row
    keys_digest = ""
    if has_keys:
        digest = conn.execute(KEYS_DIGEST).fetchone()
        keys_digest = digest[0] if digest else ""
    distributed_tables: frozenset[str] = frozenset()
    distributed_functions: frozenset[str] = frozenset()
    worker_digests: tuple[str | None, ...] | None = None
    if citus_installed(conn):
        distributed_tables = frozenset(
            r[0] for r in conn.execute("select logicalrelid::regclass::text from pg_dist_partition")
        )
        distributed_functions = frozenset(
            r[0]
            for r in conn.execute(
                "select objid::regprocedure::text from pg_catalog.pg_dist_object"
                " where classid = 'pg_proc'::regclass"
            )
        )
        worker_digests = tuple(
            (result if success else None)
            for success, result in conn.execute(
                "select success, result from run_command_on_workers(%s)", (KEYS_DIGEST,)
            )
        )
    tenant = [name for name, has_tenant in tables if has_tenant]
    local = [name for name, _ in tables if name in LOCAL_TABLES]
    reference = [name for name, has_tenant in tables if not has_tenant and name not in LOCAL_TABLES]
    if "keel.tenants" in tenant:  # distributed first: every other table colocates with it
        tenant.remove("keel.tenants")
        tenant.insert(0, "keel.tenants")
    return Layout(
        tenant_tables=tenant,
        reference_tables=reference,
        local_tables=local,
        triggered=triggered,
        foreign_keys=fks,
        api_functions=[name for name, api, _ in functions if api],
        helper_functions=[name for name, api, _ in functions if not api],
        database=database,
        distributed_tables=distributed_tables,
        distributed_functions=distributed_functions,
        installed_variants=frozenset(name for name, _, marked in functions if marked),
        owner_can_login=bool(owner_login),
        database_propagates_set_local=bool(propagates),
        keys_digest=keys_digest,
        worker_keys_digests=worker_digests,
        variants=tuple(_resolved(conn, v) for v in variants()),
    )


def _resolved(conn: psycopg.Connection, variant: Variant) -> Variant:
    """The variant named as the catalog prints its function (regprocedure text)."""
    row = conn.execute("select to_regprocedure(%s)::text", (variant.function,)).fetchone()
    return Variant(row[0], variant.path) if row and row[0] else variant


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _ident(name: str) -> str:
    if re.fullmatch(r"[a-z_][a-z0-9_$]*", name):
        return name
    return '"' + name.replace('"', '""') + '"'


def plan(layout: Layout) -> list[Step]:
    """The steps still to do, in the order Citus needs; empty when everything is done."""
    done = layout.distributed_tables
    reference = [t for t in layout.reference_tables if t not in done]
    tenant = [t for t in layout.tenant_tables if t not in done]
    pending = set(reference) | set(tenant)
    # Only the keys that touch a table still to distribute are dropped (and re-added).
    fks = [
        (t, c, d)
        for t, c, d in layout.foreign_keys
        if t in pending or any(f"REFERENCES {p}(" in d for p in pending)
    ]
    if not layout.database:
        raise ValueError("the layout names no database")
    steps: list[Step] = []
    if fks:
        steps.append(
            Step(
                "Save and drop the foreign keys of the tables to distribute (an existing FK "
                "graph cannot be distributed in place).",
                tuple(f"alter table {t} drop constraint {_ident(c)}" for t, c, _ in fks),
            )
        )
    if reference:
        steps.append(
            Step(
                "Global tables become reference tables (a copy on every node).",
                tuple(f"select create_reference_table({_literal(t)})" for t in reference),
            )
        )
    if tenant:
        stmts = []
        if layout.triggered & set(tenant):
            stmts.append("set local citus.enable_unsafe_triggers = on")
        for t in tenant:
            colocate = (
                ""
                if t == "keel.tenants" or "keel.tenants" not in layout.tenant_tables
                else f", colocate_with => {_literal(COLOCATE_WITH)}"
            )
            stmts.append(f"select create_distributed_table({_literal(t)}, 'tenant_id'{colocate})")
        steps.append(
            Step(
                "Tenant tables are distributed by tenant_id, colocated with keel.tenants.",
                tuple(stmts),
            )
        )
    if fks:
        steps.append(
            Step(
                "Re-add the foreign keys.",
                tuple(f"alter table {t} add constraint {_ident(c)} {d}" for t, c, d in fks),
            )
        )
    todo_variants = [v for v in layout.variants if v.function not in layout.installed_variants]
    if todo_variants:
        steps.append(
            Step(
                "Install the Citus variants of the functions Citus cannot run as shipped "
                "(the cross-tenant claim: an unlocked candidate scan, then a per-tenant "
                "SKIP LOCKED claim; the tenant context set with SET LOCAL, and its stamp "
                "honoured on the workers).",
                tuple(s for v in todo_variants for s in v.statements),
            )
        )
    if not layout.database_propagates_set_local:
        steps.append(
            Step(
                "SET LOCAL keel.* must reach the workers: for every login of this database "
                "(a setting on a NOLOGIN group role is not inherited by its members).",
                (
                    f"alter database {_ident(layout.database)}"
                    " set citus.propagate_set_commands = 'local'",
                ),
            )
        )
    if not layout.owner_can_login:
        steps.append(
            Step(
                f"SECURITY DEFINER functions open worker connections as their owner: "
                f"{OWNER} must log in.",
                (f"alter role {OWNER} login",),
                (
                    f"Then configure how the coordinator (and every node that runs queries) "
                    f"authenticates as {OWNER} to every node, before any API call:",
                    f"  a password: alter role {OWNER} password '...' (psql's \\password), "
                    f"and a ~/.pgpass entry for {OWNER} in the home of the postgres OS user "
                    f"on every node (host:port:{layout.database or '<database>'}:{OWNER}:...),",
                    "  or, without files: insert into pg_dist_authinfo (nodeid, rolename, "
                    f"authinfo) values (0, '{OWNER}', 'password=...') on the coordinator "
                    "(nodeid 0: every node; Citus syncs it),",
                    f"  or certificates (sslcert/sslkey in pg_dist_authinfo) with a pg_hba.conf "
                    f"entry for {OWNER} on every node.",
                    "No secret is printed or stored by agentkeel.",
                ),
            )
        )
    workers = layout.worker_keys_digests
    stale = workers is None or any(d != layout.keys_digest for d in workers)
    if KEYS_TABLE in layout.local_tables and stale:
        steps.append(
            Step(
                "Tenant-token signing keys: a plain table on every node (never a Citus table: "
                "policies would hit the nested-execution error), copied from the coordinator. "
                "Re-run after every key rotation and whenever a node is added.",
                (
                    "select run_command_on_workers(" + _literal(KEYS_DDL) + ")",
                    "select run_command_on_workers("
                    + _literal(f"alter table {KEYS_TABLE} owner to {OWNER}")
                    + ")",
                    "select run_command_on_workers("
                    + _literal(f"revoke all on {KEYS_TABLE} from public")
                    + ")",
                    "select run_command_on_workers(format("
                    + _literal(
                        "insert into keel.tenant_token_keys (key_version, inner_key,"
                        " outer_key, created_at, retired_at) values (%s, %L, %L, %L, %L)"
                        " on conflict (key_version) do update set retired_at ="
                        " excluded.retired_at"
                    )
                    + ", k.key_version, k.inner_key, k.outer_key, k.created_at, k.retired_at))"
                    " from keel.tenant_token_keys as k",
                ),
                (
                    "run_command_on_workers commits on each worker on its own (outside this "
                    "transaction); the copy is idempotent, so a failed run is simply re-run.",
                ),
            )
        )
    api = [f for f in layout.api_functions if f not in layout.distributed_functions]
    helpers = [f for f in layout.helper_functions if f not in layout.distributed_functions]
    if api:
        steps.append(
            Step(
                "API functions (first argument p_tenant_id) run on the node that holds their "
                "tenant when called outside a transaction block.",
                tuple(
                    f"select create_distributed_function({_literal(f)}::regprocedure,"
                    f" {_literal(DISTRIBUTION_ARGUMENT)},"
                    f" colocate_with := {_literal(COLOCATE_WITH)})"
                    for f in api
                ),
            )
        )
    if helpers:
        steps.append(
            Step(
                "Every other keel function is propagated to every node (functions created "
                "while the tables were local are on no worker).",
                tuple(
                    f"select create_distributed_function({_literal(f)}::regprocedure)"
                    for f in helpers
                ),
            )
        )
    if not steps:
        return []
    sequential = Step(
        "Run everything over one connection per node, so that function DDL may follow the "
        "distribution in this same transaction.",
        ("set local citus.multi_shard_modify_mode to 'sequential'",),
    )
    return [sequential, *steps]


def script(layout: Layout) -> str:
    """The plan as a psql script: one transaction, each step with its reason."""
    steps = plan(layout)
    out = [
        "-- agentkeel: distribute the keel schema by tenant_id on Citus.",
        "-- Generated from the catalog; UNVERIFIED on a live Citus cluster. Run as a superuser",
        "-- on the coordinator, after `create extension citus` on every node and citus_add_node.",
        "-- Re-run after every `agentkeel migrate up`: it only does what is still missing.",
        "-- The Citus code paths are tested on PostgreSQL only: run the conformance suite",
        '-- against the coordinator before production traffic (README, "Scale-out on Citus").',
        "-- Give agent logins no direct connection to the cluster: Citus runs the rest of a",
        "-- multi-statement query holding a SET LOCAL on the workers as keel_owner, for any",
        '-- login that may call a SECURITY DEFINER function (README, "Known hole on Citus").',
    ]
    if not steps:
        out.append("-- Nothing to do: every table, function, setting and key is in place.")
        return "\n".join(out) + "\n"
    out += ["", "begin;"]
    for number, step in enumerate(steps, 1):
        out += ["", f"-- {number}. {step.title}"]
        out += [f"-- {note}" for note in step.notes]
        out += [s if s.rstrip().endswith(";") else s + ";" for s in step.statements]
    out += ["", "commit;"]
    return "\n".join(out) + "\n"


def apply(conn: psycopg.Connection, steps: list[Step]) -> list[str]:
    """Run every step in one transaction; returns what ran. Nothing is left half done:
    an error rolls every step back (except run_command_on_workers' own commits)."""
    ran = []
    with conn.transaction():
        for step in steps:
            for stmt in step.statements:
                conn.execute(stmt.rstrip().removesuffix(";").encode())
                ran.append(stmt.splitlines()[0])
    return ran


def citus_installed(conn: psycopg.Connection) -> bool:
    row = conn.execute(
        "select exists (select 1 from pg_extension where extname = 'citus')"
    ).fetchone()
    return bool(row and row[0])
