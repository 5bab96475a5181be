-- The claimed actor (what a caller says it is, kept beside the login in claimed_actor):
-- when given, 1 to 200 characters. One check for every function that takes p_actor.
create or replace function keel.check_actor(p_actor text)
returns void
language plpgsql
immutable
set search_path = pg_catalog, pg_temp
as $$
begin
    if p_actor is not null and char_length(p_actor) not between 1 and 200 then
        raise exception using errcode = '22K01', message = 'actor must be 1 to 200 characters';
    end if;
end;
$$;

comment on function keel.check_actor(text) is
'Raises invalid_argument (22K01) unless p_actor is null or 1 to 200 characters. Shared by keel.record_session_update, keel.recover_stale_tasks, keel.recover_stale_task and the Citus variant of keel.recover_stale_tasks (granted to keel_worker for it).';
