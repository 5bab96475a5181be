-- Quotas (G9): p_delta more (or, negative, fewer) pending outbox messages of a tenant, on
-- its counter (keel.pending_message_counts), in the caller's transaction: a writer adds
-- what it writes, an ack or a death takes off what left pending, a replay adds one back.
-- The addition goes to a slot row no other open transaction holds (locked with SKIP
-- LOCKED: the backend's own slot when it is free, else the next free one, else a new
-- slot), so a writer does not wait for another, however long that one keeps its
-- transaction open (only two that make the same new slot at once meet). With p_max, the caller checks a limit: the slots' sum answers when the tenant has
-- its base (every pending message counted) and the write stays within p_max; otherwise
-- the messages are counted again, up to p_max (keel.recount_pending_messages), so a
-- refusal is always decided on a count.
-- agentkeel:requires functions/recount_pending_messages.sql
create or replace function keel.count_pending_messages(
    p_tenant_id uuid,
    p_delta integer,
    p_max bigint default null
)
returns bigint
language plpgsql
volatile
-- No SET search_path: granted to no role, it runs in its caller's pinned one.
as $$
declare
    v_own integer := 1 + pg_backend_pid() % 16;
    v_slot integer;
    v_taken integer[];
    v_held bigint;
    v_based boolean;
begin
    if p_max is not null then
        select coalesce(sum(c.pending), 0), coalesce(bool_or(c.slot = 0), false)
        into v_held, v_based
        from keel.pending_message_counts as c
        where c.tenant_id = p_tenant_id;
        if not v_based or v_held + p_delta > p_max then
            v_held := keel.recount_pending_messages(p_tenant_id, p_max);
        end if;
    end if;
    select c.slot into v_slot
    from keel.pending_message_counts as c
    where c.tenant_id = p_tenant_id and c.slot > 0
    order by (c.slot - v_own + 1023) % 1023
    limit 1
    for update skip locked;
    if found then
        -- Values only in the SET: Citus routes it as it is.
        update keel.pending_message_counts as c
        set pending = c.pending + p_delta
        where c.tenant_id = p_tenant_id and c.slot = v_slot;
    else
        -- Every slot row there is, another open transaction holds (or, for a tenant made
        -- before migration 0047, there is none yet): a new one, a free number at random
        -- above the first 16 (two writers that pick the same one meet once: the second
        -- waits for the first's commit, as it does when all 1023 are held).
        select coalesce(array_agg(c.slot), '{}') into v_taken
        from keel.pending_message_counts as c
        where c.tenant_id = p_tenant_id;
        v_slot := v_own;
        while v_slot = any(v_taken) and cardinality(v_taken) < 1024 loop
            v_slot := 17 + floor(random() * 1007)::integer;
        end loop;
        insert into keel.pending_message_counts as c (tenant_id, slot, pending)
        values (p_tenant_id, v_slot, p_delta)
        on conflict on constraint pending_message_counts_pkey
        do update set pending = c.pending + excluded.pending;
    end if;
    return v_held;
end;
$$;

comment on function keel.count_pending_messages(uuid, integer, bigint) is
'Adds p_delta to tenant p_tenant_id''s pending-message counter (keel.pending_message_counts), in a slot no other open transaction holds (never waiting for one; a new slot when all are held). With p_max, returns how many the tenant had pending before: the slots'' sum when the tenant has its base and the sum plus p_delta stays within p_max, else a new count up to p_max (keel.recount_pending_messages). Null without p_max. The caller raises when that plus p_delta passes p_max, and its error rolls the addition back with its own writes. Shared by keel.check_quota (writes and replays) and the relay''s acks and deaths; not granted to any role.';
