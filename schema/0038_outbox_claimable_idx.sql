-- agentkeel:no-transaction
-- Outbox delivery (G6): the claim index holds the claimable messages only (pending, not
-- held behind an earlier message of their key), so a claim reads no held-back backlog;
-- the held ones by key, for the sweep that promotes a key's head (keel.promote_outbox_heads).
-- Built without blocking the transitions that write the outbox; the index they replace goes
-- after them, and only once both are valid.

-- The messages pending now: the oldest of each key stays claimable, the rest are held, in
-- a transaction of its own (row locks on the held-back rows only; writers and the relay's
-- claims go on, and a claim holds such rows itself, for a moment). Run again after an
-- interruption, it rewrites only what is not held yet.
-- Row-level security (forced on keel.outbox) admits reading and writing every tenant's
-- messages, for keel_owner, only with the delivery flag on (policies outbox_delivery_*).
do $$
begin
    set local keel.outbox_delivery = on;
    update keel.outbox as o
    set held = true
    from (
        select
            p.tenant_id,
            p.message_id,
            row_number() over (
                partition by p.tenant_id, p.message_key
                order by p.created_at, p.position, p.message_id
            ) as place
        from keel.outbox as p
        where p.state = 'pending' and p.message_key is not null
    ) as r
    where o.tenant_id = r.tenant_id
        and o.message_id = r.message_id
        and r.place > 1
        and not o.held;
    set local keel.outbox_delivery = off;
end;
$$;

create index concurrently if not exists outbox_claimable_idx on keel.outbox (
    available_at, created_at, position, message_id
) where state = 'pending' and not held;

create index concurrently if not exists outbox_held_idx on keel.outbox (tenant_id, message_key)
where state = 'pending' and held;

-- The old index goes only once both new ones are valid: an interrupted build leaves an
-- INVALID index that `if not exists` would take for done.
do $$
declare
    v_invalid text;
begin
    select string_agg(c.relname, ', ') into v_invalid
    from pg_catalog.pg_index as i
    inner join pg_catalog.pg_class as c on c.oid = i.indexrelid
    where c.relnamespace = 'keel'::regnamespace
        and c.relname in ('outbox_claimable_idx', 'outbox_held_idx')
        and not i.indisvalid;
    if v_invalid is not null then
        raise exception using
            errcode = '55000',
            message = format('keel.%s is INVALID (an interrupted concurrent build)', v_invalid),
            hint = 'Drop it (drop index concurrently keel.<name>) and run agentkeel migrate up again.';
    end if;
end;
$$;

drop index concurrently if exists keel.outbox_pending_idx;
