-- Append-only history (G4): the triggers behind keel.task_events.
create or replace function keel.refuse_event_change()
returns trigger
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    if tg_op in ('DELETE', 'TRUNCATE') and current_setting('keel.purge', true) = 'on' then
        return old;
    end if;
    raise exception using
        errcode = '55K07',
        message = format('%I.%I is append-only: %s refused', tg_table_schema, tg_table_name, tg_op),
        detail = 'Events are history; they are never changed and removed only by the retention purge.',
        hint = 'Record a new event instead. Retention and tenant deletion remove events with SET LOCAL keel.purge = on, as keel_owner.';
end;
$$;

comment on function keel.refuse_event_change() is
'BEFORE UPDATE OR DELETE (per row) and BEFORE TRUNCATE (per statement) trigger on append-only tables such as keel.task_events: refuses every update, and every delete or truncate outside a purge (SET LOCAL keel.purge = on, which only roles allowed to delete can use).';
