-- Outbox delivery (G6): a message of a key becomes pending (written, or replayed); is it
-- held behind an earlier one?
create or replace function keel.outbox_key_enter(p_tenant_id uuid, p_message_key text)
returns boolean
language plpgsql
volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    v_pending integer;
begin
    -- The key's row lock: a concurrent writer of the key waits here, and so does
    -- keel.outbox_key_leave, until this transaction ends.
    insert into keel.outbox_keys as k (tenant_id, message_key, pending)
    values (p_tenant_id, p_message_key, 1)
    on conflict (tenant_id, message_key) do update set pending = k.pending + 1
    returning k.pending into v_pending;
    return v_pending > 1;
end;
$$;

comment on function keel.outbox_key_enter(uuid, text) is
'Counts one more pending message of the tenant''s key (keel.outbox_keys, row-locked until the transaction ends) and says whether it is held: true when the key already had a pending message. Called by keel.transition_task and keel.replay_dead_message. Not granted to any role.';
