-- Quotas (G9): a tenant's pending-message counter made exact again. The sum of the slots
-- and the count come from one snapshot (keel.pending_message_tally): writers, acks and recounts that
-- commit meanwhile change rows and slots together, so the difference between the two is
-- what the slots had wrong (messages the owner removed by hand, or none counted yet), and
-- adding it to the base (slot 0) corrects it without touching what open transactions
-- will add. The base row is locked first, in a statement of its own, so that two recounts
-- never fold one error twice: a recount that comes later counts in a later snapshot (READ
-- COMMITTED), which sees the fold. A check (p_max given) never waits for that lock: when
-- another transaction holds it, the check decides on its own count and leaves the fold to
-- the holder. Without p_max (the owner's recount), it waits.
create or replace function keel.recount_pending_messages(p_tenant_id uuid, p_max bigint default null)
returns bigint
language plpgsql
volatile
-- No SET search_path: granted to no role, it runs in its caller's pinned one.
as $$
declare
    v_locked boolean;
    v_based boolean;
    v_sum bigint;
    v_count bigint;
begin
    if p_max is null then
        perform 1
        from keel.pending_message_counts as c
        where c.tenant_id = p_tenant_id and c.slot = 0
        for update;
    else
        perform 1
        from keel.pending_message_counts as c
        where c.tenant_id = p_tenant_id and c.slot = 0
        for update skip locked;
    end if;
    v_locked := found;
    select t.slots, t.based, t.pending into v_sum, v_based, v_count
    from keel.pending_message_tally(p_tenant_id, p_max) as t;
    if p_max is not null and v_count >= p_max then
        -- The count stopped at the limit: what the tenant holds is not known, so nothing
        -- is folded (the caller refuses the write).
        return v_count;
    end if;
    if v_locked then
        if v_count <> v_sum then
            update keel.pending_message_counts as c
            set pending = c.pending + (v_count - v_sum)
            where c.tenant_id = p_tenant_id and c.slot = 0;
        end if;
    elsif not v_based then
        -- The tenant's first count: its base. A concurrent first count that inserted it
        -- and is still open is waited for (once per tenant made before the counter); if
        -- it committed, this one's fold is not needed.
        insert into keel.pending_message_counts (tenant_id, slot, pending)
        values (p_tenant_id, 0, v_count - v_sum)
        on conflict on constraint pending_message_counts_pkey do nothing;
    end if;
    return v_count;
end;
$$;

comment on function keel.recount_pending_messages(uuid, bigint) is
'Counts tenant p_tenant_id''s pending outbox messages again, up to p_max (all when null), and returns the count. When the count is below p_max, folds what the counter (keel.pending_message_counts) had wrong into the base slot 0, under its lock (held to commit; a check, with p_max, skips the fold when another transaction holds it; without p_max it waits), or makes the base for a tenant that has none. Called by keel.count_pending_messages when the counter cannot decide; the owner calls it (in the tenant''s context) after writing keel.outbox rows by hand. Not granted to any role.';
