-- Outbox delivery (G6): lock one outbox message of a tenant, or say it is missing. The
-- one lookup of a message by the functions that change it.
create or replace function keel.lock_outbox_message(p_tenant_id uuid, p_message_id uuid)
returns keel.outbox
language plpgsql
volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    v_message keel.outbox;
begin
    if p_tenant_id is null or p_message_id is null then
        raise exception using errcode = '22K01', message = 'tenant id and message id are required';
    end if;
    select o.* into v_message
    from keel.outbox as o
    where o.tenant_id = p_tenant_id and o.message_id = p_message_id
    for update;
    if not found then
        raise exception using
            errcode = '42K08',
            message = format('outbox message %s not found', p_message_id),
            hint = 'Check the tenant and message ids; delivered messages are removed by retention.';
    end if;
    return v_message;
end;
$$;

comment on function keel.lock_outbox_message(uuid, uuid) is
'Locks the outbox row (FOR UPDATE) and returns it; raises message_not_found (42K08) when the tenant has no such message visible to the caller. Shared by the functions that change a message; not granted to any role.';
