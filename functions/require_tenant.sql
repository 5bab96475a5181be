-- Tenant isolation (G1) and tenant deletion (G10): every API call names one tenant; it
-- must be the context's (keel.adopt_tenant), and it must not be being deleted, or deleted.
-- agentkeel:requires functions/adopt_tenant.sql
-- A tenant being deleted (keel.delete_tenant) is refused by every API call, so nothing
-- new appears behind the deleter; one that was deleted stays refused (its id is never
-- a tenant again: a token minted for it must not come back to life with a new tenant).
-- One primary-key read of keel.tenants per call, and a read of keel.tenant_deletions
-- only when the tenant has no row (create_tenant, or a call for an unknown tenant).
-- On Citus it runs inside the delegated call, on the node that holds the tenant's row.
create or replace function keel.require_tenant(p_tenant_id uuid)
returns uuid
language plpgsql
volatile
-- No SET search_path: granted to no role, it runs in its caller's pinned one.
as $$
declare
    v_since timestamptz;
    v_deleted timestamptz;
begin
    perform keel.adopt_tenant(p_tenant_id);
    select t.deleting_since into v_since from keel.tenants as t where t.tenant_id = p_tenant_id;
    if not found then
        select d.requested_at into v_deleted
        from keel.tenant_deletions as d
        where d.deleted_tenant_id = p_tenant_id;
        v_since := v_deleted;
    end if;
    if v_since is not null then
        raise exception using
            errcode = '55K17',
            message = 'the tenant is being deleted, or was deleted',
            detail = format('Its deletion began at %s (G10).', v_since),
            hint = 'Nothing is done for a deleted tenant; its id is never a tenant again.';
    end if;
    return p_tenant_id;
end;
$$;

comment on function keel.require_tenant(uuid) is
'keel.adopt_tenant (tenant_context_missing 42K01, tenant_context_mismatch 42K06, or the context adopted), then refuses a tenant that is being deleted or was deleted with tenant_deleted (55K17). Returns the tenant. Called first by every SECURITY DEFINER API function.';
