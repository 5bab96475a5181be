-- Leases with fencing (G5) and the outbox (G6): how many tasks or messages one claim (or one
-- recovery, which claims stale tasks for keel.recover) may take.
create or replace function keel.check_claim_limit(p_limit integer)
returns integer
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
declare
    v_max integer;
begin
    v_max := keel.max_batch_items();
    if p_limit is null or p_limit < 1 or p_limit > v_max then
        raise exception using
            errcode = '22K01',
            message = format('a claim takes 1 to %s items, not %s', v_max, coalesce(p_limit::text, 'null')),
            hint = 'settings.max_batch_items sets the largest batch.';
    end if;
    return p_limit;
end;
$$;

comment on function keel.check_claim_limit(integer) is
'Raises invalid_argument (22K01) unless p_limit is between 1 and settings.max_batch_items (default 1000); returns it. Internal: the one batch limit of every claim, called by keel.claim_next_tasks, keel.claim_outbox, keel.recover_stale_tasks and their Citus variants.';
