-- Tenant isolation (G1): the tenant of the current transaction, as the RLS policies see it.
-- A SQL function with a standard body: its names are bound when it is created (no
-- search_path games by the caller) and the planner inlines it into every policy, so the
-- trusted path costs almost nothing per row.
-- agentkeel:requires functions/verify_tenant_token.sql
-- agentkeel:requires functions/verify_context_proof.sql
-- agentkeel:requires functions/context_stamp.sql
-- agentkeel:requires functions/trusted_session.sql
create or replace function keel.current_tenant()
returns uuid
language sql
stable
return (
    case
        -- Transaction-scoped in the database itself: a context counts only in the
        -- transaction that bound it (keel.bind_tenant_context). A value left at session
        -- level, by this client or by an earlier client of a pooled server connection,
        -- carries an older stamp, or none, and is ignored: fail closed.
        when
            pg_catalog.current_setting('keel.context_stamp', true)
            is distinct from keel.context_stamp()
            then null
        -- Trusted server code (keel_app, keel_worker, keel_owner) sets the plain context.
        -- Every other session, keel_agent above all, must present a signed token: a plain
        -- keel.tenant_id is ignored. session_user decides (keel.trusted_session), so SET
        -- ROLE cannot promote an untrusted login, and SECURITY DEFINER functions see the
        -- caller's context.
        when keel.trusted_session()
            -- A malformed id fails the cast (22P02): closed, never another tenant.
            then nullif(pg_catalog.current_setting('keel.tenant_id', true), '')::uuid
        when coalesce(pg_catalog.current_setting('keel.tenant_token', true), '') <> ''
            then keel.verify_tenant_token(pg_catalog.current_setting('keel.tenant_token', true))
        -- On a Citus worker: the proof the coordinator made of the token it verified,
        -- bound to this login (keel.context_proof); no token key exists on a worker.
        when coalesce(pg_catalog.current_setting('keel.context_proof', true), '') <> ''
            then keel.verify_context_proof(pg_catalog.current_setting('keel.context_proof', true))
    end
);

comment on function keel.current_tenant() is
'The tenant of this transaction, or null when none is set (RLS then shows nothing). Trusted sessions (members of keel_app, keel_worker, keel_owner) use SET LOCAL keel.tenant_id; all others need set_config(''keel.tenant_token'', $1, true) with a token from keel.mint_tenant_token, verified on use (on a Citus worker, the coordinator''s keel.context_proof of it). Either counts only after keel.bind_tenant_context() in the same transaction (G1).';
