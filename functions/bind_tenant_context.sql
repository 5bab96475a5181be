-- Tenant isolation (G1): bind the tenant context set in this transaction to this transaction.
-- agentkeel:requires functions/context_stamp.sql
-- Called right after the context is set, in the same transaction: SET LOCAL keel.tenant_id
-- (trusted roles), or the agent's token as a bound, transaction-local setting. The stamp
-- is set transaction-local (set_config(..., true), SET LOCAL without parsing a statement);
-- on Citus `agentkeel distribute` replaces this with a variant that runs SET LOCAL, which
-- Citus propagates like the tenant id itself.
create or replace function keel.bind_tenant_context()
returns void
language plpgsql
volatile
set search_path = pg_catalog, pg_temp
as $$
begin
    perform pg_catalog.set_config('keel.context_stamp', keel.context_stamp(), true);
end;
$$;

comment on function keel.bind_tenant_context() is
'Marks the tenant context of the current transaction as set in it (the transaction-local keel.context_stamp = keel.context_stamp()). Without it keel.current_tenant() is null: a context left by an earlier transaction or another pooled client is never honoured (G1). Replaced on Citus by a SET LOCAL variant (agentkeel distribute).';
