-- Outbox delivery (G6): what was delivered lately, per topic, across tenants (counts only).
-- agentkeel:allow citus.tenant_filter (keel_relay counts every tenant's deliveries by design, as in keel.outbox_status: its own login reads the delivery columns of every tenant, never payloads)
-- PL/pgSQL, not SQL: Citus plans no multi-shard query from a SQL function's parameters.
create or replace function keel.outbox_delivered(p_window interval default '1 hour')
returns table (topic text, delivered bigint, last_delivered_at timestamptz)
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    v_since timestamptz := clock_timestamp()
    - least(greatest(coalesce(p_window, interval '0'), interval '0'), interval '7 days');
begin
    return query
    select o.topic, count(*), max(o.delivered_at)
    from keel.outbox as o
    where o.state = 'delivered' and o.delivered_at > v_since
    group by o.topic
    order by o.topic;
end;
$$;

comment on function keel.outbox_delivered(interval) is
'Per topic, across tenants: messages delivered within p_window before now (at most 7 days) and the last delivery. Counts only, no payload, no tenant id. SECURITY INVOKER: it sees what its caller may read, which for a keel_relay login is every tenant''s delivery columns (policy outbox_relay_scan). For `agentkeel relay status` (G6).';
