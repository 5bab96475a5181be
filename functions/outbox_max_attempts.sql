-- Outbox delivery (G6): how many attempts a message of a topic gets before it is dead.
create or replace function keel.outbox_max_attempts(p_topic text)
returns integer
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
declare
    v_max integer;
begin
    select t.max_attempts into v_max
    from keel.outbox_topics as t
    where t.topic = p_topic;
    if v_max is null then
        select s.value::integer into v_max
        from keel.settings as s
        where s.setting = 'outbox_max_attempts';
    end if;
    return greatest(coalesce(v_max, 10), 1);
end;
$$;

comment on function keel.outbox_max_attempts(text) is
'The attempts a message of p_topic gets before it is dead: keel.outbox_topics.max_attempts for the topic, else settings.outbox_max_attempts, else 10. Not granted to any role.';
