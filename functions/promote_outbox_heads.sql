-- Outbox delivery (G6): the relay's sweep over the keys with held messages, in key order
-- agentkeel:allow citus.delegation (p_after_tenant is the sweep's cursor, not the caller's tenant: the sweep runs across tenants)
-- from a cursor the caller keeps, a bounded number of keys a call. It finds the held
-- messages no retirement promoted: one whose writer committed after its key's head was
-- retired (the retiring function could not see it), or whose head an owner deleted.
-- agentkeel:allow citus.tenant_filter (the sweep reads keys of every tenant; replaced on Citus)
-- agentkeel:allow citus.set_local_autocommit (on PostgreSQL its SET LOCALs hold in autocommit too; on Citus this sweep is replaced by a variant that scans as the relay login)
create or replace function keel.promote_outbox_heads(
    p_after_tenant uuid default null,
    p_after_key text default null,
    p_keys integer default 1000
)
returns table (keys integer, promoted integer, last_tenant uuid, last_key text)
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_tenants uuid[];
    v_keys text[];
    v_stuck boolean[];
begin
    if p_keys is null or p_keys not between 1 and 100000 then
        raise exception using errcode = '22K01', message = 'sweep size must be 1 to 100000 keys';
    end if;
    -- One statement: the next keys with held messages, one index probe each (a loose scan
    -- of outbox_held_idx, never the messages behind a key), and whether each key's oldest
    -- pending message is held (one probe of outbox_key_pending_idx). Only this statement
    -- sees every tenant's rows.
    perform keel.set_claim_scan(true);
    with recursive next_keys (tenant_id, message_key, n) as (
        (
            select o.tenant_id, o.message_key, 1
            from keel.outbox as o
            where o.state = 'pending'
                and o.held
                and (o.tenant_id, o.message_key) > (
                    coalesce(p_after_tenant, '00000000-0000-0000-0000-000000000000'),
                    coalesce(p_after_key, '')
                )
            order by o.tenant_id, o.message_key
            limit 1
        )
        union all
        select nxt.tenant_id, nxt.message_key, k.n + 1
        from next_keys as k
        cross join lateral (
            select o.tenant_id, o.message_key
            from keel.outbox as o
            where o.state = 'pending'
                and o.held
                and (o.tenant_id, o.message_key) > (k.tenant_id, k.message_key)
            order by o.tenant_id, o.message_key
            limit 1
        ) as nxt
        where k.n < p_keys
    )
    select
        array_agg(k.tenant_id order by k.n),
        array_agg(k.message_key order by k.n),
        array_agg(h.held order by k.n)
    into v_tenants, v_keys, v_stuck
    from next_keys as k
    cross join lateral (
        select o.held
        from keel.outbox as o
        where o.tenant_id = k.tenant_id and o.message_key = k.message_key and o.state = 'pending'
        order by o.created_at, o.position, o.message_id
        limit 1
    ) as h;
    perform keel.set_claim_scan(false);
    keys := coalesce(array_length(v_tenants, 1), 0);
    promoted := 0;
    for i in 1 .. keys loop
        if v_stuck[i] and keel.promote_outbox_head(v_tenants[i], v_keys[i]) then
            promoted := promoted + 1;
        end if;
    end loop;
    if keys < p_keys then
        last_tenant := null;  -- the end: the next sweep starts from the first key
        last_key := null;
    else
        last_tenant := v_tenants[keys];
        last_key := v_keys[keys];
    end if;
    return next;
end;
$$;

comment on function keel.promote_outbox_heads(uuid, text, integer) is
'The relay''s sweep: for up to p_keys keys (1-100000) with held outbox messages, in (tenant_id, message_key) order after the cursor (p_after_tenant, p_after_key; null starts at the first key), calls keel.promote_outbox_head. Returns how many keys it looked at, how many heads it promoted, and the cursor for the next call (null once the last key was looked at). One statement of two index probes per key, whatever the number of held messages; a head is promoted only where it is held. Needs no tenant context (G6).';
