-- Outbox delivery (G6), on Citus: the relay's sweep over the keys with held messages.
-- agentkeel:allow citus.delegation (p_after_tenant is the sweep's cursor, not the caller's tenant: the sweep runs across tenants)
-- agentkeel:allow citus.tenant_filter (the sweep reads the keys of every tenant, without a lock)
-- Installed by `agentkeel distribute` in place of functions/promote_outbox_heads.sql, whose
-- scan over every tenant would reach the workers as its owner (keel_owner may not log in on
-- a cluster). Callers do not change. SECURITY INVOKER: the scan runs as the relay's own
-- login (policy outbox_relay_scan, column grants: keys, never payloads), one multi-shard
-- query a call for the next keys after the cursor; keel.promote_outbox_head then runs on the
-- node that holds each key's tenant.
create or replace function keel.promote_outbox_heads(
    p_after_tenant uuid default null,
    p_after_key text default null,
    p_keys integer default 1000
)
returns table (keys integer, promoted integer, last_tenant uuid, last_key text)
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
set "citus.max_adaptive_executor_pool_size" = 1
as $$
declare
    v_tenants uuid[];
    v_keys text[];
    v_promoted boolean;
begin
    if p_keys is null or p_keys not between 1 and 100000 then
        raise exception using errcode = '22K01', message = 'sweep size must be 1 to 100000 keys';
    end if;
    -- Each shard reads its held messages in key order (outbox_held_idx) until it has
    -- p_keys distinct keys; no message is locked or read beyond its key.
    select
        array_agg(c.tenant_id order by c.tenant_id, c.message_key),
        array_agg(c.message_key order by c.tenant_id, c.message_key)
    into v_tenants, v_keys
    from (
        select distinct o.tenant_id, o.message_key
        from keel.outbox as o
        where o.state = 'pending'
            and o.held
            and (o.tenant_id, o.message_key) > (
                coalesce(p_after_tenant, '00000000-0000-0000-0000-000000000000'),
                coalesce(p_after_key, '')
            )
        order by o.tenant_id, o.message_key
        limit p_keys
    ) as c;
    keys := coalesce(array_length(v_tenants, 1), 0);
    promoted := 0;
    for i in 1 .. keys loop
        -- Called in FROM, as the Citus keel.claim_outbox calls keel.claim_due_message: so
        -- Citus delegates it to the tenant's node (called in an expression, it would run
        -- here, as the function's owner, and reach the shards as keel_owner).
        select p.done into v_promoted
        from keel.promote_outbox_head(v_tenants[i], v_keys[i]) as p (done);
        if v_promoted then
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
'Citus variant (installed by agentkeel distribute; SECURITY INVOKER): the relay''s sweep. For up to p_keys keys (1-100000) with held outbox messages, in (tenant_id, message_key) order after the cursor (p_after_tenant, p_after_key; null starts at the first key), found by one multi-shard scan of message keys as the relay login, calls keel.promote_outbox_head on each key''s node. Returns how many keys it looked at, how many heads it promoted, and the cursor for the next call (null once the last key was looked at). Same contract as the PostgreSQL function (G6).';
