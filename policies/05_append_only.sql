-- Append-only history (G4): task events refuse UPDATE, DELETE and TRUNCATE, even by the
-- owner, except deletes (and truncates) inside a purge.
set local "citus.enable_unsafe_triggers" = on;

drop trigger if exists task_events_append_only on keel.task_events;

create trigger task_events_append_only
before update or delete on keel.task_events
for each row execute function keel.refuse_event_change();

-- TRUNCATE fires no row triggers: a statement trigger is the only kind there is for it.
drop trigger if exists task_events_append_only_truncate on keel.task_events;

create trigger task_events_append_only_truncate
before truncate on keel.task_events
for each statement execute function keel.refuse_event_change();

-- The tombstones a tenant deletion keeps of its events (G10) are history too.
drop trigger if exists task_event_tombstones_append_only on keel.task_event_tombstones;

create trigger task_event_tombstones_append_only
before update or delete on keel.task_event_tombstones
for each row execute function keel.refuse_event_change();

drop trigger if exists task_event_tombstones_append_only_truncate on keel.task_event_tombstones;

create trigger task_event_tombstones_append_only_truncate
before truncate on keel.task_event_tombstones
for each statement execute function keel.refuse_event_change();
