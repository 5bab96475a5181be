"""The Citus distribution step (CITUS.md §(a) item 26), generated from the catalog so that no
table or function, including ones other releases add, can be forgotten.

The execution model it sets up (docs/citus.md): every API
call runs on the node that holds its tenant, as the caller's own login. Functions that
take ``p_tenant_id`` and are granted to an application role are distributed by that
argument with ``force_delegation``, so Citus sends the call itself to that node, inside a
transaction block too, over a connection of the caller's login; the SECURITY DEFINER body
then runs there against local shards only. ``keel_owner`` owns every object and may not
log in on any node: Citus can never open a connection as the owner of the tables, so no
login can get SQL of its choosing run as that owner on a worker (by a multi-statement
``SET LOCAL``, citusdata/citus#356, or otherwise). Cross-tenant scans are SECURITY
INVOKER variants (tools/agentkeel/citus/). An agent's token is verified on the
coordinator only (the signing keys never leave it); workers trust a proof bound to the
agent's login (``keel.context_proof``), signed with keys (``keel.context_keys``) this step
creates and copies to every worker.

`read_layout` reads the catalog (and, where Citus is installed, what is already
distributed); `plan` is pure: catalog rows in, steps out, so a second run plans nothing
for what the first one did and says so. `script` prints the plan; the CLI's `--apply`
runs every step in one transaction.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from pglast import split

from agentkeel.global_tables import local_tables
from agentkeel.sql_files import sql_root

# Plain per-node tables (keel.global_tables() placement 'local'), read from its file for
# lint; read_layout takes them from the catalog.
LOCAL_TABLES = local_tables()
# The keys a worker verifies an agent's context proof with: copied to every worker.
KEYS_TABLE = "keel.context_keys"
# The token signing keys: the coordinator's alone; removed from any worker that has them.
TOKEN_KEYS_TABLE = "keel.tenant_token_keys"
# Functions replaced on Citus by a variant shipped here (CITUS.md (b)): same signature.
CITUS_DIR = Path(__file__).resolve().parent / "citus"
CITUS_VARIANTS = sorted(CITUS_DIR.glob("*.sql"))
# The comment every variant's function carries, so a run can tell it is installed.
VARIANT_MARK = "Citus variant"
# The shipped privileges, applied again once functions are on the workers.
PRIVILEGES = Path("policies") / "03_privileges.sql"
# keel functions a worker lets PUBLIC execute (a function Citus creates on a worker gets
# PostgreSQL's default ACL before the shipped grants are applied to it).
PUBLIC_FUNCTIONS = (
    "select count(*) from pg_proc p where p.pronamespace = 'keel'::regnamespace"
    " and (p.proacl is null or exists (select 1 from aclexplode(p.proacl) a where a.grantee = 0))"
)
# The role that owns every keel object; it must not log in on a cluster.
OWNER = "keel_owner"
APPLICATION_ROLES = (
    "keel_app",
    "keel_worker",
    "keel_relay",
    "keel_agent",
    "keel_auditor",
    "keel_watchdog",
)
DISTRIBUTION_ARGUMENT = "p_tenant_id"
COLOCATE_WITH = "keel.tenants"
# The digest of the context keys on a node, to tell whether a worker's copy is current.
KEYS_DIGEST = (
    "select coalesce(string_agg(k.key_version::text || ':' || coalesce(k.retired_at::text, '')"
    " || ':' || md5(k.inner_key || k.outer_key), ',' order by k.key_version), '')"
    " from keel.context_keys as k"
)
# The keys table as every worker has it: schema/0031_context_keys.sql's definition.
KEYS_DDL = (
    "create table if not exists keel.context_keys ("
    " key_version integer not null, inner_key bytea not null, outer_key bytea not null,"
    " created_at timestamptz not null default now(), retired_at timestamptz,"
    " constraint context_keys_pkey primary key (key_version),"
    " constraint context_keys_key_version_check check (key_version > 0),"
    " constraint context_keys_inner_key_check check (octet_length(inner_key) = 64),"
    " constraint context_keys_outer_key_check check (octet_length(outer_key) = 64))"
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
    # Delegated by p_tenant_id: granted to an application role, reading no local table.
    api_functions: list[str]
    # Propagated to every node, never delegated: every other keel function...
    helper_functions: list[str] = field(default_factory=list)
    # ...except those that depend on a local table, which stay on the coordinator.
    coordinator_functions: list[str] = field(default_factory=list)
    database: str = ""
    # What a run before this one already did (empty where Citus is not installed):
    distributed_tables: frozenset[str] = frozenset()  # pg_dist_partition
    distributed_functions: frozenset[str] = frozenset()  # pg_dist_object
    delegated_functions: frozenset[str] = frozenset()  # by p_tenant_id, force_delegation
    installed_variants: frozenset[str] = frozenset()  # functions carrying VARIANT_MARK
    owner_can_login: bool = False
    database_propagates_set_local: bool = False  # ALTER DATABASE ... SET done
    has_context_key: bool = False  # an active key in the coordinator's keel.context_keys
    keys_digest: str = ""  # the coordinator's context keys
    # each worker's context keys (None: no table there); None: unknown, no Citus
    worker_keys_digests: tuple[str | None, ...] | None = None
    workers_with_token_keys: int = 0  # workers holding keel.tenant_token_keys
    workers_public_functions: int = 0  # keel functions PUBLIC may execute, over workers
    variants: tuple[Variant, ...] = ()


@dataclass(frozen=True)
class Step:
    title: str  # what it does, printed as a comment
    statements: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # what the DBA must do by hand, printed as comments


def privileges() -> list[str]:
    """The statements of the shipped privileges file, as migrate applies them."""
    text = (sql_root() / PRIVILEGES).read_text()
    return [s.strip() for s in split(text, with_parser=True) if s.strip()]


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
    local = [
        r[0]
        for r in conn.execute(
            "select g.table_name from keel.global_tables() as g"
            " where g.placement = 'local' and to_regclass(g.table_name) is not null"
            " order by 1"
        )
    ]
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
    # Per function: takes p_tenant_id; granted to an application role; depends on a local
    # table (pg_depend: SQL-standard bodies); names a local table in its source (PL/pgSQL);
    # carries the variant mark.
    functions = conn.execute(
        "select p.oid::regprocedure::text,"
        " %(arg)s = any(coalesce(p.proargnames, '{}')),"
        " exists (select 1 from unnest(%(roles)s::text[]) as r (role)"
        "  where to_regrole(r.role) is not null"
        "  and has_function_privilege(r.role, p.oid, 'execute')"
        "  and not pg_has_role(r.role, p.proowner, 'usage')),"
        " exists (select 1 from pg_depend d where d.classid = 'pg_proc'::regclass"
        "  and d.objid = p.oid and d.refclassid = 'pg_class'::regclass"
        "  and d.refobjid::regclass::text = any(%(local)s::text[])),"
        " exists (select 1 from unnest(%(local)s::text[]) as l (t)"
        "  where p.prosrc like '%%' || l.t || '%%'),"
        " coalesce(obj_description(p.oid, 'pg_proc'), '') like %(mark)s"
        " from pg_proc p join pg_namespace n on n.oid = p.pronamespace"
        " where n.nspname = 'keel' and p.prokind = 'f' order by 1",
        {
            "arg": DISTRIBUTION_ARGUMENT,
            "roles": list(APPLICATION_ROLES),
            "local": local,
            "mark": VARIANT_MARK + "%",
        },
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
    has_context_key = False
    if has_keys:
        digest = conn.execute(KEYS_DIGEST).fetchone()
        keys_digest = digest[0] if digest else ""
        active = conn.execute(
            "select exists (select 1 from keel.context_keys where retired_at is null)"
        ).fetchone()
        has_context_key = bool(active and active[0])
    distributed_tables: frozenset[str] = frozenset()
    distributed_functions: frozenset[str] = frozenset()
    delegated: frozenset[str] = frozenset()
    worker_digests: tuple[str | None, ...] | None = None
    token_keys_on_workers = 0
    public_functions = 0
    if citus_installed(conn):
        distributed_tables = frozenset(
            r[0] for r in conn.execute("select logicalrelid::regclass::text from pg_dist_partition")
        )
        dist = conn.execute(
            "select objid::regprocedure::text,"
            " distribution_argument_index is not null and coalesce(force_delegation, false)"
            " from pg_catalog.pg_dist_object where classid = 'pg_proc'::regclass"
        ).fetchall()
        distributed_functions = frozenset(name for name, _ in dist)
        delegated = frozenset(name for name, forced in dist if forced)
        worker_digests = tuple(
            (result if success else None)
            for success, result in conn.execute(
                "select success, result from run_command_on_workers(%s)", (KEYS_DIGEST,)
            )
        )
        token_keys_on_workers = sum(
            1
            for success, result in conn.execute(
                "select success, result from run_command_on_workers(%s)",
                (f"select to_regclass('{TOKEN_KEYS_TABLE}') is not null",),
            )
            if success and result == "t"
        )
        public_functions = sum(
            int(result)
            for success, result in conn.execute(
                "select success, result from run_command_on_workers(%s)", (PUBLIC_FUNCTIONS,)
            )
            if success and result.isdigit()
        )
    tenant = [name for name, has_tenant in tables if has_tenant]
    reference = [name for name, has_tenant in tables if not has_tenant and name not in local]
    if "keel.tenants" in tenant:  # distributed first: every other table colocates with it
        tenant.remove("keel.tenants")
        tenant.insert(0, "keel.tenants")
    return Layout(
        tenant_tables=tenant,
        reference_tables=reference,
        local_tables=[name for name, _ in tables if name in local],
        triggered=triggered,
        foreign_keys=fks,
        api_functions=[
            name for name, arg, granted, dep, src, _ in functions if arg and granted and not src
        ],
        helper_functions=[
            name
            for name, arg, granted, dep, src, _ in functions
            if not dep and not (arg and granted and not src)
        ],
        coordinator_functions=[name for name, _, _, dep, _, _ in functions if dep],
        database=database,
        distributed_tables=distributed_tables,
        distributed_functions=distributed_functions,
        delegated_functions=delegated,
        installed_variants=frozenset(name for name, *_, marked in functions if marked),
        owner_can_login=bool(owner_login),
        database_propagates_set_local=bool(propagates),
        has_context_key=has_context_key,
        keys_digest=keys_digest,
        worker_keys_digests=worker_digests,
        workers_with_token_keys=token_keys_on_workers,
        workers_public_functions=public_functions,
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


def _on_workers(statement: str) -> str:
    return "select run_command_on_workers(" + _literal(statement) + ")"


def plan(layout: Layout, shard_count: int | None = None) -> list[Step]:
    """The steps still to do, in the order Citus needs; empty when everything is done.
    shard_count: the shards of the tenant tables still to distribute (Citus' default,
    citus.shard_count, when None). The cross-tenant scans visit every shard, so their cost
    grows with it."""
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
        if shard_count is not None:
            stmts.append(f"set local citus.shard_count = {int(shard_count)}")
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
                "Install the Citus variants: the cross-tenant scans run as the caller's login "
                "(an unlocked candidate scan, then a per-tenant SKIP LOCKED step on each "
                "candidate's node), workflows are defined by the owner's login, the tenant "
                "context is set with SET LOCAL (which Citus propagates), its stamp is honoured "
                "on the workers, and an agent's bind hands them a proof of its verified token.",
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
    if layout.owner_can_login:
        steps.append(
            Step(
                f"{OWNER} owns the tables: no node may ever accept a connection as it, so "
                f"that no login can have SQL of its choosing run there as the owner.",
                (f"alter role {OWNER} nologin",),
                (
                    f"Remove any password or pg_dist_authinfo entry kept for {OWNER}: "
                    "nothing connects as it any more.",
                ),
            )
        )
    if KEYS_TABLE in layout.local_tables and not layout.has_context_key:
        steps.append(
            Step(
                "The first key for the workers' context proofs (an agent's verified tenant, "
                "bound to its login).",
                ("select keel.rotate_context_key()",),
            )
        )
    workers = layout.worker_keys_digests
    stale = (
        workers is None
        or not layout.has_context_key
        or any(d != layout.keys_digest for d in workers)
    )
    if KEYS_TABLE in layout.local_tables and stale:
        steps.append(
            Step(
                "Context keys: a plain table on every worker (never a Citus table: policies "
                "would hit the nested-execution error), copied from the coordinator. Re-run "
                "after keel.rotate_context_key() and whenever a node is added.",
                (
                    _on_workers(KEYS_DDL),
                    _on_workers(f"alter table {KEYS_TABLE} owner to {OWNER}"),
                    _on_workers(f"revoke all on {KEYS_TABLE} from public"),
                    "select run_command_on_workers(format("
                    + _literal(
                        "insert into keel.context_keys (key_version, inner_key, outer_key,"
                        " created_at, retired_at) values (%s, %L, %L, %L, %L)"
                        " on conflict (key_version) do update set inner_key ="
                        " excluded.inner_key, outer_key = excluded.outer_key,"
                        " retired_at = excluded.retired_at"
                    )
                    + ", k.key_version, k.inner_key, k.outer_key, k.created_at, k.retired_at))"
                    " from keel.context_keys as k",
                ),
                (
                    "run_command_on_workers commits on each worker on its own (outside this "
                    "transaction); the copy is idempotent, so a failed run is simply re-run.",
                ),
            )
        )
    if layout.workers_with_token_keys:
        steps.append(
            Step(
                "Token signing keys stay on the coordinator: remove any worker's copy.",
                (_on_workers(f"drop table if exists {TOKEN_KEYS_TABLE}"),),
            )
        )
    api = [f for f in layout.api_functions if f not in layout.delegated_functions]
    helpers = [f for f in layout.helper_functions if f not in layout.distributed_functions]
    if api:
        steps.append(
            Step(
                "API functions (p_tenant_id, granted to an application role) run on the node "
                "that holds their tenant, as the caller's login, in a transaction block too "
                "(force_delegation): their SECURITY DEFINER bodies touch local shards only.",
                tuple(
                    f"select create_distributed_function({_literal(f)}::regprocedure,"
                    f" {_literal(DISTRIBUTION_ARGUMENT)},"
                    f" colocate_with := {_literal(COLOCATE_WITH)}, force_delegation := true)"
                    for f in api
                ),
            )
        )
    if helpers:
        steps.append(
            Step(
                "Every other keel function is propagated to every node (functions created "
                "while the tables were local are on no worker); never delegated.",
                tuple(
                    f"select create_distributed_function({_literal(f)}::regprocedure)"
                    for f in helpers
                ),
            )
        )
    if api or helpers or layout.workers_public_functions:
        steps.append(
            Step(
                "Apply the shipped privileges again (policies/03_privileges.sql), now that "
                "every function is on the workers: Citus creates a function there with "
                "PostgreSQL's default ACL (EXECUTE for PUBLIC) and copies only the grants.",
                tuple(privileges()),
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


def script(layout: Layout, shard_count: int | None = None) -> str:
    """The plan as a psql script: one transaction, each step with its reason."""
    steps = plan(layout, shard_count)
    out = [
        "-- agentkeel: distribute the keel schema by tenant_id on Citus.",
        "-- Generated from the catalog. Run as a superuser on the coordinator, after",
        "-- `create extension citus` on every node and citus_add_node for each worker.",
        "-- Re-run after every `agentkeel migrate up`: it only does what is still missing.",
        "-- What it sets up: docs/citus.md.",
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
