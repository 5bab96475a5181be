-- agentkeel check: on Citus, no login that acts as an agent has a connection of its own
-- (G1). Citus sends a propagated SET LOCAL to the workers as the whole query text the
-- client sent, over every worker connection open in the transaction, including those a
-- SECURITY DEFINER function opened as keel_owner: a login that sends several statements
-- in one query runs them on the workers as the owner of the tables (README, "Known hole
-- on Citus"). Any login that may call such a function can; agent logins are named
-- because their SQL is untrusted by design, where the other roles run the deployment's
-- own code. A warning, since whether agents reach the cluster directly is not in the
-- catalog. Logins that act as keel_agent (inherit its privileges) are named, not those
-- that only administer it (the migrator, keel_owner's members). Nothing is reported
-- without Citus (pg_dist_local_group).
select
    'citus_agent_logins' as rule,
    'G1' as guarantee,
    'warning' as level,
    r.rolname::text as object,
    'on Citus, a keel_agent login with a connection of its own can run SQL on the '
    || 'workers as keel_owner (a multi-statement SET LOCAL is propagated whole)' as problem,
    format(
        'Serve agents through trusted code that sends one statement per query '
        || '(README, Known hole on Citus), or ALTER ROLE %I NOLOGIN;',
        r.rolname
    ) as remedy
from pg_catalog.pg_roles as r
where
    r.rolcanlogin
    and not r.rolsuper
    and pg_catalog.pg_has_role(r.oid, 'keel_agent', 'USAGE')
    and not pg_catalog.pg_has_role(r.oid, 'keel_owner', 'USAGE')
    and pg_catalog.to_regclass('pg_catalog.pg_dist_local_group') is not null
order by r.rolname;
