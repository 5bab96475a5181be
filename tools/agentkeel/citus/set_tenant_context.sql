-- Tenant isolation (G1), on Citus: make a verified tenant the transaction's plain context.
-- Installed by `agentkeel distribute` in place of functions/set_tenant_context.sql, whose
-- set_config Citus never propagates.
-- The one place a function sets keel.tenant_id. Called by keel.require_tenant once it has
-- verified the caller's context, and by keel.claim_next_task for the tenant it claimed.
-- It runs inside a query of its caller (PERFORM), one executor level below the client's
-- statement: Citus propagates a SET LOCAL made there to the worker connections of the
-- transaction even in autocommit (a SET LOCAL made by the statement a client sent is
-- propagated only inside a transaction block), so a worker, whose connections run as
-- keel_owner and trust only the plain keel.tenant_id, sees the tenant the coordinator
-- verified. On PostgreSQL alone it changes nothing a caller can see: an agent's context
-- still comes from its token alone (keel.current_tenant decides on session_user).
create or replace function keel.set_tenant_context(p_verified uuid)
returns void
language plpgsql
volatile
set search_path = pg_catalog, pg_temp
as $$
begin
    -- null clears the context (the Citus claim, after a candidate it could not lock).
    execute format('set local keel.tenant_id = %L', coalesce(p_verified::text, ''));
    perform keel.bind_tenant_context();
end;
$$;

comment on function keel.set_tenant_context(uuid) is
'Citus variant (installed by agentkeel distribute): sets SET LOCAL keel.tenant_id to a tenant the caller has verified (null clears it: no context), and binds it to this transaction (keel.bind_tenant_context). Internal: called by keel.require_tenant, keel.claim_next_tasks and keel.recover_stale_tasks, one executor level below the client''s statement so that Citus propagates it; EXECUTE is not granted to any application role.';
