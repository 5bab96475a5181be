-- Tenant isolation (G1): every API call names one tenant, and it must be the context's.
-- Volatile, because it then sets the verified tenant as the transaction's plain context
-- (keel.set_tenant_context) so that worker nodes of a Citus cluster, which trust only
-- keel.tenant_id, see exactly the tenant verified here. A non-volatile PL/pgSQL function
-- could not run SET; callers invoke it with PERFORM, so it is never inlined or folded.
create or replace function keel.require_tenant(p_tenant_id uuid)
returns uuid
language plpgsql
volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    v_context uuid := keel.current_tenant();
begin
    if p_tenant_id is null then
        raise exception using errcode = '22K01', message = 'tenant id is required';
    end if;
    if v_context is null then
        raise exception using
            errcode = '42K01',
            message = 'no tenant context in this transaction',
            hint = 'In this transaction: SET LOCAL keel.tenant_id (trusted roles) or set_config(''keel.tenant_token'', $1, true) (agents), then select keel.bind_tenant_context(); the agentkeel client does this per call.';
    end if;
    if v_context <> p_tenant_id then
        raise exception using
            errcode = '42K06',
            message = 'the tenant argument is not the tenant of this transaction',
            hint = 'Pass the tenant id the context was set for.';
    end if;
    -- Set only when the plain setting is not already the verified tenant (an agent's
    -- first call in a transaction; anything planted there is overwritten). The stamp is
    -- this transaction's already: keel.current_tenant() returned a tenant.
    if pg_catalog.current_setting('keel.tenant_id', true) is distinct from v_context::text then
        perform keel.set_tenant_context(v_context);
    end if;
    return v_context;
end;
$$;

comment on function keel.require_tenant(uuid) is
'Raises tenant_context_missing (42K01) without a context, tenant_context_mismatch (42K06) when p_tenant_id is another tenant; returns the tenant, after setting it as the transaction''s plain context (keel.set_tenant_context: SET LOCAL keel.tenant_id and the stamp) so that Citus worker nodes see the verified tenant. Called first by every SECURITY DEFINER API function.';
