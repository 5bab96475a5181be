-- Outbox delivery (G6): a dead message goes back to the relay, under the same id.
create or replace function keel.replay_outbox(p_tenant_id uuid, p_message_id uuid)
returns keel.outbox
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    perform keel.require_tenant(p_tenant_id);
    return keel.replay_dead_message(p_tenant_id, p_message_id);
end;
$$;

comment on function keel.replay_outbox(uuid, uuid) is
'Puts a dead message of the tenant of the current context back to pending, available now, with attempts 0, claims 0 and the SAME message_id, so consumers that already applied it still dedupe. last_error is kept until the next failure. Raises message_not_dead (55K09) for a pending or delivered message, message_not_found (42K08) for an unknown one (G6).';
