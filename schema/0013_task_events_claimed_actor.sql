-- The recorded actor is the login (G3, G4): a caller-supplied label is kept apart.
alter table keel.task_events add column claimed_actor text;

alter table keel.task_events
add constraint task_events_claimed_actor_check
check (char_length(claimed_actor) between 1 and 200) not valid;
-- Not validated: every existing row has a null claimed_actor, and new rows are checked.

comment on column keel.task_events.actor is
'The login (session_user) whose session wrote the event. Set by the database, never by the caller.';
comment on column keel.task_events.claimed_actor is
'A label the caller passed as p_actor (a user, an agent name), stored as claimed: the database does not verify it.';
