-- Append-only history (G4): the trigger behind keel.task_events.
create or replace function keel.refuse_event_change()
returns trigger
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    if tg_op = 'DELETE' and current_setting('keel.purge', true) = 'on' then
        return old;
    end if;
    raise exception using
        errcode = '55K07',
        message = format('keel.task_events is append-only: %s refused', tg_op),
        detail = 'Events are history; they are never changed and removed only by the retention purge.',
        hint = 'Record a new event instead. Retention and tenant deletion remove events with SET LOCAL keel.purge = on, as keel_owner.';
end;
$$;

comment on function keel.refuse_event_change() is
'BEFORE UPDATE OR DELETE trigger on keel.task_events: refuses every update, and every delete outside a purge (SET LOCAL keel.purge = on, which only roles allowed to delete can use).';
