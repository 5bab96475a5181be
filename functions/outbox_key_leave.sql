-- Outbox delivery (G6): a key's head leaves pending (delivered or dead): the next message
-- of the key, if any, becomes its head.
create or replace function keel.outbox_key_leave(p_tenant_id uuid, p_message_key text)
returns void
language plpgsql
volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    v_pending integer;
    v_next uuid;
begin
    -- The key's row lock first (see keel.outbox_key_enter): a message written after this
    -- transaction then counts itself against what is left here, and one written before it
    -- has committed and is visible to the lookups below, which run after the lock.
    select k.pending into v_pending
    from keel.outbox_keys as k
    where k.tenant_id = p_tenant_id and k.message_key = p_message_key
    for update;
    if coalesce(v_pending, 1) <= 1 then
        delete from keel.outbox_keys as k
        where k.tenant_id = p_tenant_id and k.message_key = p_message_key;
    else
        update keel.outbox_keys as k
        set pending = k.pending - 1
        where k.tenant_id = p_tenant_id and k.message_key = p_message_key;
    end if;
    -- The next head, unless the key has one: the caller has already taken the leaving
    -- message out of pending, so any pending message not held is a head (one that was
    -- in flight when migration 0036 ran may have left while the oldest stayed pending).
    if exists (
        select 1
        from keel.outbox as o
        where o.tenant_id = p_tenant_id
            and o.message_key = p_message_key
            and o.state = 'pending'
            and not o.held
    ) then
        return;
    end if;
    select o.message_id into v_next
    from keel.outbox as o
    where o.tenant_id = p_tenant_id
        and o.message_key = p_message_key
        and o.state = 'pending'
        and o.held
    order by o.created_at, o.position, o.message_id
    limit 1;
    if v_next is not null then
        update keel.outbox as o
        set held = false
        where o.tenant_id = p_tenant_id and o.message_id = v_next;
    end if;
end;
$$;

comment on function keel.outbox_key_leave(uuid, text) is
'Counts one pending message of the tenant''s key less (keel.outbox_keys, row-locked) and, unless a pending message of the key is already claimable, makes the oldest held one (created_at, position, message_id) claimable. Called when a key''s head is delivered or goes dead (keel.ack_outbox, keel.nack_outbox, keel.claim_locked_message). Not granted to any role.';
