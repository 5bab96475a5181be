-- Tenant isolation (G1): make a verified tenant the transaction's plain context.
-- The one place a function sets keel.tenant_id. Called by keel.require_tenant once it has
-- verified the caller's context, by keel.claim_next_tasks for the tenant it claimed, and
-- by keel.recover_stale_tasks. On PostgreSQL it changes nothing a caller can see: an
-- agent's context still comes from its token alone (keel.current_tenant decides on
-- session_user). set_config(..., true) is SET LOCAL without parsing a statement: this runs
-- on every API call. On Citus, `agentkeel distribute` replaces it with a variant that
-- runs SET LOCAL, which Citus propagates to the workers (set_config it never does), so a
-- worker, whose connections run as keel_owner and trust only the plain keel.tenant_id,
-- sees the tenant the coordinator verified.
create or replace function keel.set_tenant_context(p_verified uuid)
returns void
language plpgsql
volatile
-- No SET search_path: granted to no role, it runs in its caller's pinned one.
as $$
begin
    -- null clears the context (the Citus claim, after a candidate it could not lock).
    perform pg_catalog.set_config('keel.tenant_id', coalesce(p_verified::text, ''), true);
    perform keel.bind_tenant_context();
end;
$$;

comment on function keel.set_tenant_context(uuid) is
'Sets the transaction-local keel.tenant_id to a tenant the caller has verified (null clears it: no context), and binds it to this transaction (keel.bind_tenant_context). Internal: called by keel.require_tenant, keel.claim_next_tasks and keel.recover_stale_tasks; EXECUTE is not granted to any application role. Replaced on Citus by a SET LOCAL variant (agentkeel distribute).';
