-- Redaction (G9): every stored payload (event payloads, outbox messages, operation
-- results and errors, task metadata) is checked here, and only here.
drop function if exists keel.check_event_payload(jsonb);

create or replace function keel.check_payload(
    p_what text,
    p_payload jsonb,
    p_limit_setting text
)
returns void
language plpgsql
stable
-- No SET search_path: granted to no role, it runs in its caller's pinned one.
as $$
declare
    v_depth integer;
    v_limit integer;
    v_size integer;
    v_path text;
    v_rules text;
    v_keys text[];
    v_secrets jsonb;
begin
    if p_payload is null or p_payload = '{}'::jsonb or p_payload = '[]'::jsonb then
        return;  -- nothing to walk: the common case costs one comparison
    end if;

    -- A value far over the limit is refused before anything walks it: pg_column_size reads
    -- its header only, and no JSON text is shorter than a quarter of its stored form (4x
    -- for an array of zeros, 2x for empty containers, less for strings and keys), so past
    -- 8x the limit the text is surely over it.
    select s.value::integer into v_limit
    from keel.settings as s
    where s.setting = p_limit_setting;
    v_limit := coalesce(v_limit, 65536);
    if pg_column_size(p_payload) > 8::bigint * v_limit then
        raise exception using
            errcode = '22K02',
            message = format('%s is over the limit of %s bytes', p_what, v_limit),
            hint = format(
                'Store large data as an artifact and keep its reference; settings.%s sets the limit.',
                p_limit_setting
            );
    end if;

    -- Depth next, before anything else walks the value: a jsonpath that descends at most
    -- one level past the limit, so a deep payload costs no more than a shallow one.
    select s.value::integer into v_depth
    from keel.settings as s
    where s.setting = 'max_payload_depth';
    v_depth := coalesce(v_depth, 64);
    if jsonb_path_exists(p_payload, format('strict $.**{%s}', v_depth + 1)::jsonpath) then
        raise exception using
            errcode = '22K02',
            message = format('%s nests deeper than %s levels', p_what, v_depth),
            hint = 'Flatten the structure; settings.max_payload_depth sets the limit.';
    end if;

    v_size := octet_length(p_payload::text);
    if v_size > v_limit then
        raise exception using
            errcode = '22K02',
            message = format('%s is %s bytes, over the limit of %s', p_what, v_size, v_limit),
            hint = format(
                'Store large data as an artifact and keep its reference; settings.%s sets the limit.',
                p_limit_setting
            );
    end if;

    -- Numbers every JSON reader can hold: 0, or a magnitude an IEEE 754 double holds
    -- (I-JSON, RFC 7493). Past it Python's json refuses an integer of more than 4300
    -- digits, and others fail or read Infinity (which no JSON may carry on): a relay or
    -- consumer that cannot read one message must never be handed it.
    if jsonb_path_exists(
        p_payload,
        'strict $.** ? (@.type() == "number" && @ != 0'
        ' && (@.abs() > 1.7976931348623157e308 || @.abs() < 2.2250738585072014e-308))'
    ) then
        raise exception using
            errcode = '22K02',
            message = format('%s holds a number no IEEE 754 double can hold', p_what),
            detail = 'Nonzero numbers must lie between 2.2250738585072014e-308 and 1.7976931348623157e308 in magnitude; the value was not stored.',
            hint = 'Send such a value as a string.';
    end if;

    -- The rules as one regular expression that a whole folded key matches when a rule
    -- refuses it: a contains pattern anywhere in it, a suffix pattern at its end, an exact
    -- pattern as all of it (patterns are [a-z0-9] only, and so are folded keys). Null
    -- when there are no rules.
    select '^(?:' || nullif(
        concat_ws(
            '|',
            '[a-z0-9]*(?:'
            || string_agg(r.pattern, '|' order by r.pattern) filter (where r.match = 'contains')
            || ')[a-z0-9]*',
            '[a-z0-9]*(?:'
            || string_agg(r.pattern, '|' order by r.pattern) filter (where r.match = 'suffix')
            || ')',
            string_agg(r.pattern, '|' order by r.pattern) filter (where r.match = 'exact')
        ),
        ''
    ) || ')$'
    into v_rules
    from keel.redaction_rules as r;
    if v_rules is null then
        return;  -- no rules
    end if;

    -- Every key at any depth (a jsonpath lists the objects, jsonb_object_keys their keys: a
    -- third of what .keyvalue() costs), each distinct key once, all folded in one
    -- keel.fold_keys call (no choice of keys makes that slow), then the expression run once
    -- over all the folded keys, one a line ('n': ^ and $ match at each line): one scan, where
    -- LIKE ANY took a microsecond or two for every key. The common case, no match, ends here.
    v_keys := array(
        select distinct k.key
        from jsonb_path_query(p_payload, 'strict $.** ? (@.type() == "object")') as o (value)
        cross join lateral jsonb_object_keys(o.value) as k (key)
    );

    with folded as materialized (
        select f.key, f.folded
        from keel.fold_keys(v_keys) as f
    )

    select jsonb_object_agg(f.key, true) into v_secrets  -- the keys that matched
    from folded as f
    where f.folded in (
        select m.line[1]
        from regexp_matches(
            (select string_agg(g.folded, e'\n') from folded as g), v_rules, 'gn'
        ) as m (line)
    );
    if v_secrets is null then
        return;
    end if;

    -- A key matched: walk again, with paths, to name the first one in path order. The
    -- depth bound above keeps this linear in the size, and paths are cut at 200 characters
    -- (all a message shows) so long keys cannot make it quadratic. Only objects and arrays
    -- are expanded, each by the one function that lists its members (the where clauses
    -- skip the other: each scan cost a microsecond or so), and of their members only those
    -- that are objects or arrays or have a key that matched are kept.
    with recursive walk (path, key, value) as (
        select '$'::text, null::text, p_payload
        union all
        select child.path, child.key, child.value
        from walk as w
        cross join lateral (
            select left(w.path || '.' || o.key, 200), o.key, o.value
            from jsonb_each(
                case when jsonb_typeof(w.value) = 'object' then w.value else '{}'::jsonb end
            ) as o (key, value)
            where
                jsonb_typeof(w.value) = 'object'
                and (jsonb_typeof(o.value) in ('object', 'array') or v_secrets ? o.key)
            union all
            select left(w.path || '[' || (a.idx - 1) || ']', 200), null::text, a.value
            from jsonb_array_elements(
                case when jsonb_typeof(w.value) = 'array' then w.value else '[]'::jsonb end
            ) with ordinality as a (value, idx)
            where jsonb_typeof(w.value) = 'array' and jsonb_typeof(a.value) in ('object', 'array')
        ) as child (path, key, value)
        where jsonb_typeof(w.value) in ('object', 'array')
    )

    select w.path into v_path
    from walk as w
    where v_secrets ? w.key
    order by w.path
    limit 1;
    if v_path is not null then
        raise exception using
            errcode = '22K02',
            message = format('%s key %s may carry a secret', p_what, v_path),
            detail = 'Keys listed in keel.redaction_rules are refused at any depth; the value was not stored.',
            hint = 'Drop the key, or store a reference to a secret manager instead of the secret.';
    end if;
end;
$$;

comment on function keel.check_payload(text, jsonb, text) is
'Raises payload_rejected (22K02) when a payload''s stored form is over 8 times the limit (checked first, without reading the value), nests deeper than settings.max_payload_depth (checked next), is larger than the settings row named by p_limit_setting, holds a nonzero number no IEEE 754 double can hold, or has a key at any depth whose keel.fold_key form matches keel.redaction_rules. p_what names the payload in the message; the message names the key path, never a value (G9).';
