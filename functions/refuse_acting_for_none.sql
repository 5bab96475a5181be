-- Tenant isolation (G1): a transaction that took tasks of several tenants acts for none.
-- agentkeel:requires functions/no_tenant.sql
create or replace function keel.refuse_acting_for_none(p_context uuid, p_hint text)
returns void
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
begin
    if p_context = keel.no_tenant() then
        raise exception using
            errcode = '42K06',
            message = 'this transaction took tasks of several tenants and acts for none of them',
            hint = p_hint;
    end if;
end;
$$;

comment on function keel.refuse_acting_for_none(uuid, text) is
'Raises tenant_context_mismatch (42K06), with p_hint, when p_context is keel.no_tenant(): the transaction claimed or recovered tasks of several tenants and may act for none of them. Internal: the one refusal keel.require_tenant, the claims and the recoverer (and their Citus variants) make.';
