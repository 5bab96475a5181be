-- Retention (G11): the tenants keel.purge goes through, a page at a time, in id order.
-- agentkeel:requires functions/set_claim_scan.sql
-- agentkeel:allow citus.tenant_filter (it pages through every tenant's id, as the owner, for the purge)
create or replace function keel.purge_tenants(p_after uuid, p_limit integer)
returns setof uuid
language plpgsql
volatile
-- SECURITY INVOKER, owner only: it reads every tenant's id through the owner's scan
-- policy on keel.tenants (tenants_owner_scan), with the flag on for this statement.
set search_path = pg_catalog, pg_temp
as $$
begin
    if p_limit is null or p_limit not between 1 and 10000 then
        raise exception using
            errcode = '22K01',
            message = format('a page holds 1 to 10000 tenants, not %s', coalesce(p_limit::text, 'null'));
    end if;
    perform keel.set_claim_scan(true);
    return query
    select t.tenant_id
    from keel.tenants as t
    where p_after is null or t.tenant_id > p_after
    order by t.tenant_id
    limit p_limit;
    perform keel.set_claim_scan(false);
end;
$$;

comment on function keel.purge_tenants(uuid, integer) is
'The next p_limit tenant ids after p_after (null: from the first), in id order: the tenants agentkeel purge runs keel.purge for. Owner only (G11).';
