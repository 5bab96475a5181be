-- Outbox delivery (G6): which tenants have due messages, for the fair share of a claim.
-- agentkeel:allow citus.tenant_filter (the claim's discovery reads every tenant; the Citus claim has its own)
-- A loose scan of outbox_tenant_claimable_idx: one probe for the next tenant with pending
-- messages, one for whether any of them is due; never the messages behind a tenant's first.
-- It starts at a random point between the lowest and the highest tenant id with pending
-- messages (tenant ids made at about the same time share their leading digits, so a start
-- anywhere in the uuid space would nearly always wrap to the lowest) and wraps around. It
-- visits at most four tenants with pending messages per tenant it may return, so a claim
-- costs no more when many tenants' messages all wait (in backoff, claimed, or of other
-- topics); the claim's oldest-first half still reaches every due message.
create or replace function keel.outbox_tenants_due(
    p_now timestamptz,
    p_topic_prefix text,
    p_tenants integer
)
returns uuid[]
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
declare
    v_low uuid;
    v_high uuid;
    v_start uuid;
    v_after uuid;
    v_wrapped boolean := false;
    v_tenant uuid;
    v_due uuid[] := '{}';
    v_visited integer := 0;
begin
    if p_tenants < 1 then
        return v_due;
    end if;
    select o.tenant_id into v_low
    from keel.outbox as o
    where o.state = 'pending' and not o.held
    order by o.tenant_id
    limit 1;
    if v_low is null then
        return v_due;
    end if;
    select o.tenant_id into v_high
    from keel.outbox as o
    where o.state = 'pending' and not o.held
    order by o.tenant_id desc
    limit 1;
    -- A random point between them, by their first 15 hex digits (60 bits).
    v_start := (
        lpad(
            to_hex(
                ('x' || left(replace(v_low::text, '-', ''), 15))::bit(60)::bigint
                + floor(
                    random() * (
                        ('x' || left(replace(v_high::text, '-', ''), 15))::bit(60)::bigint
                        - ('x' || left(replace(v_low::text, '-', ''), 15))::bit(60)::bigint
                        + 1
                    )
                )::bigint
            ),
            15,
            '0'
        )
        || '00000000000000000'
    )::uuid;
    v_after := v_start;
    loop
        select o.tenant_id into v_tenant
        from keel.outbox as o
        where o.state = 'pending' and not o.held and o.tenant_id > v_after
        order by o.tenant_id
        limit 1;
        if v_tenant is null then
            exit when v_wrapped;
            v_wrapped := true;
            v_after := '00000000-0000-0000-0000-000000000000';
            continue;
        end if;
        exit when v_wrapped and v_tenant >= v_start;
        v_visited := v_visited + 1;
        -- "Due" as a row comparison, which only outbox_tenant_claimable_idx serves: a
        -- generic plan of `available_at <= p_now` walked the claim index, oldest first,
        -- past every other tenant's due message to reach this one's (35 ms behind 100,000).
        if exists (
            select 1
            from keel.outbox as o
            where o.tenant_id = v_tenant
                and (o.tenant_id, o.available_at) <= (v_tenant, p_now)
                and o.state = 'pending'
                and not o.held
                and (p_topic_prefix is null or starts_with(o.topic, p_topic_prefix))
        ) then
            v_due := v_due || v_tenant;
            exit when cardinality(v_due) >= p_tenants;
        end if;
        exit when v_visited >= 4 * p_tenants;
        v_after := v_tenant;
    end loop;
    return v_due;
end;
$$;

comment on function keel.outbox_tenants_due(timestamptz, text, integer) is
'Internal to keel.claim_outbox (run with keel.scan_all_tenants on): up to p_tenants tenants with a pending, unheld message due at p_now (of a topic starting with p_topic_prefix, when given), found by a loose scan of outbox_tenant_claimable_idx from a random point between the lowest and the highest tenant id with pending messages, wrapping around, visiting at most 4 * p_tenants tenants with pending messages. The claim gives each of them its share of the batch before any tenant gets more.';
