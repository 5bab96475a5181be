-- Outbox delivery (G6), on Citus: counts per topic across tenants.
-- agentkeel:allow citus.tenant_filter (counts over every tenant: keel_relay's status, no row of any tenant leaves it)
-- Installed by `agentkeel distribute` in place of functions/outbox_status.sql, a SECURITY
-- DEFINER function that would reach the workers as keel_owner (which may not log in on a
-- cluster). SECURITY INVOKER: a multi-shard SELECT of message metadata as the caller
-- (keel_relay reads those columns of every tenant: policy outbox_relay_scan, column grants).
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
security invoker
set search_path = pg_catalog, pg_temp
-- The scan's shard queries go over one connection per worker, the one Citus keeps open
-- between statements: a pool of new connections per call (the default, up to 16 per
-- worker, each with its TLS handshake) cost more than the scan.
set "citus.max_adaptive_executor_pool_size" = 1
as $$
declare
    v_now timestamptz := clock_timestamp();
begin
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
end;
$$;

comment on function keel.outbox_status() is
'Citus variant (installed by agentkeel distribute; SECURITY INVOKER): per topic, across tenants: messages pending (waiting, in backoff or with an expired claim), in flight (claimed, claim not expired), dead, and the age of the oldest pending one. Counts only, no payload, no tenant id (G6).';
