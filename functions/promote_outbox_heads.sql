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
    v_tenant uuid := p_after_tenant;
    v_key text := p_after_key;
begin
    if p_keys is null or p_keys not between 1 and 100000 then
        raise exception using errcode = '22K01', message = 'sweep size must be 1 to 100000 keys';
    end if;
    keys := 0;
    promoted := 0;
    loop
        exit when keys >= p_keys;
        -- One index probe per key (outbox_held_idx), never the messages behind it. Only
        -- this statement sees every tenant's rows.
        set local keel.scan_all_tenants = on;
        select o.tenant_id, o.message_key into last_tenant, last_key
        from keel.outbox as o
        where o.state = 'pending'
            and o.held
            and (o.tenant_id, o.message_key) > (
                coalesce(v_tenant, '00000000-0000-0000-0000-000000000000'), coalesce(v_key, '')
            )
        order by o.tenant_id, o.message_key
        limit 1;
        set local keel.scan_all_tenants = off;
        if not found then
            last_tenant := null;  -- the end: the next sweep starts from the first key
            last_key := null;
            exit;
        end if;
        keys := keys + 1;
        if keel.promote_outbox_head(last_tenant, last_key) then
            promoted := promoted + 1;
        end if;
        v_tenant := last_tenant;
        v_key := last_key;
    end loop;
    return next;
end;
$$;

comment on function keel.promote_outbox_heads(uuid, text, integer) is
'The relay''s sweep: for up to p_keys keys (1-100000) with held outbox messages, in (tenant_id, message_key) order after the cursor (p_after_tenant, p_after_key; null starts at the first key), calls keel.promote_outbox_head. Returns how many keys it looked at, how many heads it promoted, and the cursor for the next call (null once the last key was looked at). One index probe per key, whatever the number of held messages. Needs no tenant context (G6).';
