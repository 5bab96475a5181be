-- Redaction (G9): event payloads carry no secrets and stay small.
create or replace function keel.check_event_payload(p_payload jsonb)
returns void
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
declare
    v_limit integer;
    v_size integer := octet_length(p_payload::text);
    v_path text;
begin
    select s.value::integer into v_limit
    from keel.settings as s
    where s.setting = 'max_event_payload_bytes';
    if v_size > coalesce(v_limit, 65536) then
        raise exception using
            errcode = '22K02',
            message = format('event payload is %s bytes, over the limit of %s', v_size, v_limit),
            hint = 'Store large data as an artifact and put its reference in the event.';
    end if;

    with recursive walk (path, key, value) as (
        select '$'::text, null::text, p_payload
        union all
        select child.path, child.key, child.value
        from walk as w
        cross join lateral (
            select w.path || '.' || o.key, o.key, o.value
            from jsonb_each(
                case when jsonb_typeof(w.value) = 'object' then w.value else '{}'::jsonb end
            ) as o (key, value)
            union all
            select w.path || '[' || (a.idx - 1) || ']', null::text, a.value
            from jsonb_array_elements(
                case when jsonb_typeof(w.value) = 'array' then w.value else '[]'::jsonb end
            ) with ordinality as a (value, idx)
        ) as child (path, key, value)
    ),
    keys as (
        select
            w.path,
            lower(regexp_replace(normalize(w.key, nfkc), '[^[:alnum:]]', '', 'g')) as normalized
        from walk as w
        where w.key is not null
    )
    select k.path into v_path
    from keys as k
    inner join keel.redaction_rules as r
        on (r.match = 'exact' and k.normalized = r.pattern)
        or (r.match = 'contains' and strpos(k.normalized, r.pattern) > 0)
    order by k.path
    limit 1;
    if v_path is not null then
        raise exception using
            errcode = '22K02',
            message = format('event payload key %s may carry a secret', left(v_path, 200)),
            detail = 'Keys listed in keel.redaction_rules are refused at any depth; the value was not stored.',
            hint = 'Drop the key, or store a reference to a secret manager instead of the secret.';
    end if;
end;
$$;

comment on function keel.check_event_payload(jsonb) is
'Raises payload_rejected (22K02) when the payload is larger than settings.max_event_payload_bytes or has a key, at any depth, matching keel.redaction_rules. The message names the key path, never a value (G9).';
