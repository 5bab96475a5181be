-- Tenant isolation (G1): every API call names one tenant, and it must be the context's.
create or replace function keel.require_tenant(p_tenant_id uuid)
returns uuid
language plpgsql
stable
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
    return v_context;
end;
$$;

comment on function keel.require_tenant(uuid) is
'Raises tenant_context_missing (42K01) without a context, tenant_context_mismatch (42K06) when p_tenant_id is another tenant; returns the tenant. Called first by every API function.';
