-- Append-only history (G4): task events refuse UPDATE and DELETE, even by the owner,
-- except deletes inside a purge.
set local "citus.enable_unsafe_triggers" = on;

drop trigger if exists task_events_append_only on keel.task_events;

create trigger task_events_append_only
before update or delete on keel.task_events
for each row execute function keel.refuse_event_change();
