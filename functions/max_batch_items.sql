-- Batches (G3, G5, G6): the most items one call takes, defined once. A claim, a recovery
-- and a batch of transitions or reservations each stop at it (keel.check_claim_limit,
-- keel.check_batch); clients fit their batches to it (agentkeel relay, agentkeel recover).
create or replace function keel.max_batch_items()
returns integer
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
declare
    v_max integer;
begin
    select s.value::integer into v_max
    from keel.settings as s
    where s.setting = 'max_batch_items';
    return coalesce(v_max, 1000);
end;
$$;

comment on function keel.max_batch_items() is
'settings.max_batch_items (default 1000): the most tasks or messages one claim or recovery takes and the most items one batch call holds. Granted to keel_worker and keel_relay, whose clients fit their batches to it.';
