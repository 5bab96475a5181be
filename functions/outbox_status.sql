-- Outbox delivery (G6): what waits, per topic, across tenants (counts only).
-- agentkeel:allow citus.tenant_filter (an operator's count over every tenant; on Citus a multi-shard read, not snapshot-consistent)
-- agentkeel:allow citus.set_local_autocommit (a read: in autocommit on Citus it counts less, never another tenant's payload)
create or replace function keel.outbox_status()
returns table (
    topic text,
    pending bigint,
    in_flight bigint,
    dead bigint,
    oldest_pending_age interval
)
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_now timestamptz := clock_timestamp();
begin
    perform keel.set_claim_scan(true);
    return query
    select
        o.topic,
        count(*) filter (
            where o.state = 'pending' and (o.claimed_by is null or o.available_at <= v_now)
        ),
        count(*) filter (
            where o.state = 'pending' and o.claimed_by is not null and o.available_at > v_now
        ),
        count(*) filter (where o.state = 'dead'),
        v_now - min(o.created_at) filter (where o.state = 'pending')
    from keel.outbox as o
    where o.state in ('pending', 'dead')
    group by o.topic
    order by o.topic;
    perform keel.set_claim_scan(false);
end;
$$;

comment on function keel.outbox_status() is
'Per topic, across tenants: messages pending (waiting, in backoff or with an expired claim), in flight (claimed, claim not expired), dead, and the age of the oldest pending one. Counts only, no payload, no tenant id. For keel_relay (agentkeel relay status) and operators (G6).';
