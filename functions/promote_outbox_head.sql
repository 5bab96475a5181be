-- Outbox delivery (G6): make a key's head claimable. A keyed message written while its key
-- had a pending message is held (migration 0037); when the message before it is delivered
-- or dead, the function that retired it calls this, and the relay's sweep calls it for
-- every key with held messages (keel.promote_outbox_heads), which catches a message its
-- writer committed after the head's retirement looked. Never waits: a head another
-- transaction has locked is left for the next sweep.
-- agentkeel:allow citus.require_tenant (keel_relay works across tenants and has no tenant context; the call can only make a key's oldest pending message claimable, which the claim's own per-key check still orders)
-- agentkeel:allow citus.set_local_autocommit (in autocommit on Citus the delivery flag does not reach the shard: the lookup sees no row and nothing is promoted; the sweep calls it again)
create or replace function keel.promote_outbox_head(p_tenant_id uuid, p_message_key text)
returns boolean
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    -- The relay's own functions call this with the delivery flag on; it stays on for them.
    v_flag_on boolean := coalesce(current_setting('keel.outbox_delivery', true), '') = 'on';
    v_head keel.outbox;
    v_promoted boolean := false;
begin
    if p_tenant_id is null or p_message_key is null then
        return false;
    end if;
    if not v_flag_on then
        set local keel.outbox_delivery = on;
    end if;
    select o.* into v_head
    from keel.outbox as o
    where o.tenant_id = p_tenant_id and o.message_key = p_message_key and o.state = 'pending'
    order by o.created_at, o.position, o.message_id
    limit 1;
    if found and v_head.held then
        perform 1
        from keel.outbox as o
        where o.tenant_id = p_tenant_id
            and o.message_id = v_head.message_id
            and o.state = 'pending'
            and o.held
        for update skip locked;
        if found then
            update keel.outbox as o
            set held = false
            where o.tenant_id = p_tenant_id and o.message_id = v_head.message_id;
            v_promoted := true;
        end if;
    end if;
    if not v_flag_on then
        set local keel.outbox_delivery = off;
    end if;
    return v_promoted;
end;
$$;

comment on function keel.promote_outbox_head(uuid, text) is
'Makes the oldest pending message (created_at, position, message_id) of the tenant''s key claimable when it is held, and says whether it did; does nothing when that message is claimable already, when the key has no pending message, or when another transaction holds the message locked (never waits). Called when a keyed message is delivered or goes dead, and by keel.promote_outbox_heads for every key with held messages. Needs no tenant context (G6).';
