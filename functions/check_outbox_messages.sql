-- Outbox delivery (G6) and payload limits (G9): the shape and number of the messages a
-- transition is asked to write, checked before the task is looked up. Their sizes and
-- keys (keel.check_payload) are checked later, once the cheap refusals have had their say.
create or replace function keel.check_outbox_messages(p_outbox jsonb)
returns void
language plpgsql
stable
-- No SET search_path: granted to no role, it runs in its caller's pinned one.
as $$
declare
    v_max_messages integer;
    v_message jsonb;
begin
    if p_outbox is null or jsonb_typeof(p_outbox) <> 'array' then
        raise exception using
            errcode = '22K01',
            message = 'outbox must be a jsonb array of messages';
    end if;
    select s.value::integer into v_max_messages
    from keel.settings as s
    where s.setting = 'max_transition_messages';
    v_max_messages := coalesce(v_max_messages, 1000);
    if jsonb_array_length(p_outbox) > v_max_messages then
        raise exception using
            errcode = '22K02',
            message = format(
                'a transition writes at most %s outbox messages, not %s',
                v_max_messages, jsonb_array_length(p_outbox)
            ),
            hint = 'Split the work over several transitions; settings.max_transition_messages sets the limit.';
    end if;
    for v_message in select m.value from jsonb_array_elements(p_outbox) as m (value) loop
        if jsonb_typeof(v_message) <> 'object'
            or jsonb_typeof(v_message -> 'topic') is distinct from 'string'
            or (v_message ? 'key' and jsonb_typeof(v_message -> 'key') <> 'string')
            or (v_message ? 'headers' and jsonb_typeof(v_message -> 'headers') <> 'object') then
            raise exception using
                errcode = '22K01',
                message = 'each outbox message must be an object with a string "topic"',
                detail = 'Optional members: "key" (string), "payload" (any json), "headers" (object).';
        end if;
    end loop;
end;
$$;

comment on function keel.check_outbox_messages(jsonb) is
'Raises invalid_argument (22K01) unless p_outbox is a jsonb array of objects, each with a string "topic" and optionally a string "key", any "payload" and an object "headers"; raises payload_rejected (22K02) when it holds more than settings.max_transition_messages messages (G9). Shared by keel.transition_task; not granted to any role.';
