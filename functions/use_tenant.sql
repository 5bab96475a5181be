-- Tenant isolation (G1): a trusted login's tenant context for the rest of this transaction.
-- agentkeel:allow citus.delegation (named p_tenant, not p_tenant_id, on purpose: it must run where the transaction began, never be delegated to a worker, so that the SET LOCAL it makes is the whole distributed transaction's)
-- What the client sends instead of `SET LOCAL keel.tenant_id = ...; select
-- keel.bind_tenant_context()`: one statement, the tenant as a bound parameter, and no
-- multi-statement query string (on Citus the whole text of a query holding a SET LOCAL is
-- sent on to the workers). For a trusted login keel.adopt_tenant decides, as for every
-- API call (whose keel.require_tenant also refuses a tenant being deleted, on the node
-- that holds it): without a context it gets this one (SET LOCAL, bound, propagated on
-- Citus); a transaction that has a context keeps it and refuses another tenant (42K06). Any other
-- login gets the plain setting too, which means nothing to it (its context comes from its
-- signed token alone): the same as its own SET LOCAL keel.tenant_id would.
create or replace function keel.use_tenant(p_tenant uuid)
returns uuid
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    if keel.trusted_session() then
        return keel.adopt_tenant(p_tenant);
    end if;
    perform keel.set_tenant_context(p_tenant);
    return keel.current_tenant();
end;
$$;

comment on function keel.use_tenant(uuid) is
'Sets the plain tenant context of the current transaction (SET LOCAL keel.tenant_id, bound to the transaction) and returns the transaction''s tenant. For a trusted login (keel_app, keel_worker, keel_owner) as keel.adopt_tenant decides: p_tenant becomes the context, or the context it already has must be p_tenant (else tenant_context_mismatch, 42K06). For any other login the plain setting is ignored: it returns its token''s tenant, or null. Runs where the transaction began, so that on Citus the context reaches every node (G1).';
