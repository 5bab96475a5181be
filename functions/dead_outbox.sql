-- Outbox delivery (G6): a page of the caller's tenant's dead messages.
create or replace function keel.dead_outbox(
    p_tenant_id uuid,
    p_topic text default null,
    p_after uuid default null,
    p_limit integer default 100
)
returns setof keel.outbox
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    perform keel.require_tenant(p_tenant_id);
    if p_limit is null or p_limit not between 1 and 1000 then
        raise exception using errcode = '22K01', message = 'page size must be 1 to 1000';
    end if;
    return query
    select o.*
    from keel.outbox as o
    where o.tenant_id = p_tenant_id
        and o.state = 'dead'
        and (p_topic is null or o.topic = p_topic)
        and (p_after is null or o.message_id > p_after)
    order by o.message_id
    limit p_limit;
end;
$$;

comment on function keel.dead_outbox(uuid, text, uuid, integer) is
'Up to p_limit (1-1000) dead outbox messages of the tenant of the current context, optionally of one topic, in message_id order, with attempts, last_error and dead_at; pass the last message_id seen as p_after for the next page (G6).';
