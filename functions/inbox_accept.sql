-- The inbox (G6): a consumer accepts a message once, in its own transaction.
create or replace function keel.inbox_accept(
    p_tenant_id uuid,
    p_consumer text,
    p_message_id uuid
)
returns boolean
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_now timestamptz := clock_timestamp();
    v_inserted integer;
begin
    perform keel.require_tenant(p_tenant_id);
    if p_consumer is null or p_consumer !~ '^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,199}$' then
        raise exception using
            errcode = '22K01',
            message = 'consumer must be 1 to 200 characters: letters, digits and _ . : / -';
    end if;
    if p_message_id is null then
        raise exception using errcode = '22K01', message = 'message id is required';
    end if;

    -- A concurrent accept of the same id waits here for the other transaction: if it
    -- commits this one answers false, if it rolls back this one inserts.
    insert into keel.inbox (tenant_id, consumer, message_id, accepted_at)
    values (p_tenant_id, p_consumer, p_message_id, v_now)
    on conflict on constraint inbox_pkey do nothing;
    get diagnostics v_inserted = row_count;
    return v_inserted = 1;
end;
$$;

comment on function keel.inbox_accept(uuid, text, uuid) is
'Records that p_consumer accepted p_message_id for the tenant of the current context. Call it in the same transaction as the effect, first: true means apply the effect; false means this consumer accepted the id before (a redelivery) and nothing was written. Commit or roll back the two together (G6).';
