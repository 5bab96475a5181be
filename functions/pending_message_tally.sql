-- Quotas (G9): a tenant's pending outbox messages two ways, from one snapshot: the sum of
-- its counter's slots (keel.pending_message_counts), whether it has its base, and the one
-- count of its pending messages, up to p_max (all when null). Two partial indexes, the
-- claimable messages and the held ones, hold them all. One statement, on one tenant's
-- rows: on Citus one query on the tenant's node.
create or replace function keel.pending_message_tally(
    p_tenant_id uuid,
    p_max bigint,
    out slots bigint,
    out based boolean,
    out pending bigint
)
language plpgsql
stable
-- No SET search_path: granted to no role, it runs in its caller's pinned one.
as $$
begin
    with
        counter as (
            select coalesce(sum(c.pending), 0) as slots, coalesce(bool_or(c.slot = 0), false) as based
            from keel.pending_message_counts as c
            where c.tenant_id = p_tenant_id
        ),

        messages as (
            select count(*) as pending
            from (
                select 1
                from keel.outbox as o
                where o.tenant_id = p_tenant_id and o.state = 'pending' and not o.held
                union all
                select 1
                from keel.outbox as o
                where o.tenant_id = p_tenant_id and o.state = 'pending' and o.held
                limit p_max
            ) as u
        )

    select counter.slots, counter.based, messages.pending
    into slots, based, pending
    from counter cross join messages;
end;
$$;

comment on function keel.pending_message_tally(uuid, bigint) is
'Tenant p_tenant_id''s pending outbox messages, from one snapshot: slots, the sum of its keel.pending_message_counts; based, whether it has its base (slot 0); pending, its pending messages counted up to p_max (all when null). Shared by keel.quota_used and keel.recount_pending_messages; not granted to any role.';
