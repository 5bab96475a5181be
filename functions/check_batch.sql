-- The shape of a batch (G2, G3): a jsonb array of objects, each with the members named,
-- no larger than settings.max_batch_items items and settings.max_batch_bytes bytes. A
-- malformed batch is refused whole before any item runs, so the per-item outcomes only
-- ever report what the single call decides.
create or replace function keel.check_batch(p_items jsonb, p_required text[])
returns integer
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
declare
    v_max integer;
    v_bytes bigint;
    v_count integer;
    v_bad integer;
begin
    if p_items is null or jsonb_typeof(p_items) <> 'array' then
        raise exception using errcode = '22K01', message = 'a batch must be a jsonb array of objects';
    end if;
    -- The byte budget first: pg_column_size reads the value's header, not the value.
    select s.value::bigint into v_bytes
    from keel.settings as s
    where s.setting = 'max_batch_bytes';
    v_bytes := coalesce(v_bytes, 4194304);
    if pg_column_size(p_items) > v_bytes then
        raise exception using
            errcode = '22K01',
            message = format(
                'a batch holds at most %s bytes, not %s', v_bytes, pg_column_size(p_items)
            ),
            detail = 'Nothing of the batch was run.',
            hint = 'Split it; settings.max_batch_bytes sets the limit.';
    end if;
    v_max := keel.max_batch_items();
    v_count := jsonb_array_length(p_items);
    if v_count > v_max then
        raise exception using
            errcode = '22K01',
            message = format('a batch holds at most %s items, not %s', v_max, v_count),
            hint = 'Split it; settings.max_batch_items sets the limit.';
    end if;
    select i.idx into v_bad
    from jsonb_array_elements(p_items) with ordinality as i (value, idx)
    where jsonb_typeof(i.value) <> 'object'
        or exists (
            select from unnest(p_required) as r (member)
            where jsonb_typeof(i.value -> r.member) is null
                or jsonb_typeof(i.value -> r.member) = 'null'
        )
    order by i.idx
    limit 1;
    if v_bad is not null then
        raise exception using
            errcode = '22K01',
            message = format('batch item %s is not an object with %s', v_bad, array_to_string(p_required, ', ')),
            detail = 'Nothing of the batch was run.';
    end if;
    return v_count;
end;
$$;

comment on function keel.check_batch(jsonb, text[]) is
'Raises invalid_argument (22K01) unless p_items is a jsonb array of at most settings.max_batch_items (default 1000) objects, at most settings.max_batch_bytes (default 4 MiB, stored size) in all, that each have every member named in p_required, non-null. Returns the number of items. Internal: called by the batch functions before any item runs.';
