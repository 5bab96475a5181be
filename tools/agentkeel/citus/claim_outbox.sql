-- Outbox delivery (G6), on Citus: claim pending outbox messages of any tenant, oldest first.
-- agentkeel:allow citus.tenant_filter (the candidate scan reads every tenant, without a lock)
-- Installed by `agentkeel distribute` in place of functions/claim_outbox.sql, whose single
-- FOR UPDATE SKIP LOCKED over every tenant is a multi-shard row lock, which Citus refuses,
-- and which, as a SECURITY DEFINER function on the coordinator, would reach the workers as
-- its owner (keel_owner may not log in on a cluster). Callers do not change.
-- SECURITY INVOKER: everything it does on the workers runs as the relay's own login.
--   1. An unlocked candidate scan over every tenant, a batch at a time: a multi-shard SELECT
--      of message metadata (keel_relay may read those columns of every tenant, never
--      payloads: policy outbox_relay_scan, column grants). The first batch is fair across
--      tenants: each tenant's oldest due message, then each one's second, and so on (a
--      rank within its tenant, computed on the tenant's shard); the later ones oldest
--      available_at first.
--   2. For each candidate, keel.claim_due_message on the node that holds its tenant, which
--      locks it with SKIP LOCKED and rechecks that it is still pending, due and the oldest
--      pending message of its key.
create or replace function keel.claim_outbox(
    p_relay text,
    p_limit integer default 100,
    p_lease interval default '30 seconds',
    p_topic_prefix text default null
)
returns setof keel.outbox
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
-- The scan's shard queries go over one connection per worker, the one Citus keeps open
-- between statements: a pool of new connections per call (the default, up to 16 per
-- worker, each with its TLS handshake) cost more than the scan.
set "citus.max_adaptive_executor_pool_size" = 1
-- As in the PostgreSQL function: no JIT compilation of a scan that reads a few entries.
set jit = off
as $$
declare
    v_round integer := greatest(64, p_limit);
    v_now timestamptz := clock_timestamp();
    v_tenants uuid[];
    v_ids uuid[];
    v_availables timestamptz[];
    -- Candidates in available_at order only, the pending index's order (the messages of
    -- one transaction share one available_at): rounds as in the Citus keel.claim_next_tasks,
    -- the rest of a full round's last tie group (v_tie, minus what was tried) next.
    v_after timestamptz := '-infinity';
    v_tie timestamptz;
    v_tried text[] := '{}';
    v_count integer;
    v_message keel.outbox;
    v_claimed integer := 0;
    -- The first round ranks the candidates within their tenants.
    v_fair boolean := true;
begin
    perform keel.check_lease_request(p_relay, p_lease, v_now);
    perform keel.check_claim_limit(p_limit);
    loop
        select
            array_agg(c.tenant_id order by c.place, c.available_at),
            array_agg(c.message_id order by c.place, c.available_at),
            array_agg(c.available_at order by c.place, c.available_at)
        into v_tenants, v_ids, v_availables
        from (
            select r.tenant_id, r.message_id, r.available_at, r.place
            from (
                select
                    o.tenant_id,
                    o.message_id,
                    o.available_at,
                    -- The fair round's order: a message's place among its tenant's due
                    -- messages (every place is 1 in the other rounds).
                    case when v_fair then
                        row_number() over (
                            partition by o.tenant_id
                            order by o.available_at, o.created_at, o.position, o.message_id
                        )
                    else 1 end as place
                from keel.outbox as o
                where o.state = 'pending'
                    and o.available_at <= v_now
                    and (p_topic_prefix is null or starts_with(o.topic, p_topic_prefix))
                    and not o.held
                    and (
                        o.message_key is null
                        or not exists (
                            select 1
                            from keel.outbox as e
                            where e.tenant_id = o.tenant_id
                                and e.message_key = o.message_key
                                and e.state = 'pending'
                                and (e.created_at, e.position, e.message_id)
                                < (o.created_at, o.position, o.message_id)
                        )
                    )
                    and (
                        v_fair
                        or (v_tie is null and o.available_at > v_after)
                        or (
                            o.available_at = v_tie
                            and o.tenant_id::text || '/' || o.message_id::text <> all(v_tried)
                        )
                    )
            ) as r
            order by r.place, r.available_at
            limit case when v_tie is null then v_round end
        ) as c;
        v_count := coalesce(array_length(v_tenants, 1), 0);
        for i in 1 .. v_count loop
            v_tried := v_tried || (v_tenants[i]::text || '/' || v_ids[i]::text);
            select c.* into v_message
            from keel.claim_due_message(v_tenants[i], v_ids[i], p_relay, p_lease, p_topic_prefix) as c;
            if v_message.message_id is not null then
                return next v_message;
                v_claimed := v_claimed + 1;
                exit when v_claimed >= p_limit;
            end if;
        end loop;
        exit when v_claimed >= p_limit;
        if v_fair then
            -- The rest of the batch oldest first, from the beginning.
            v_fair := false;
            v_tried := '{}';
        elsif v_tie is not null then
            v_after := v_tie;
            v_tie := null;
            v_tried := '{}';
        elsif v_count < v_round then
            exit;
        else
            v_tie := v_availables[v_count];
        end if;
    end loop;
end;
$$;

comment on function keel.claim_outbox(text, integer, interval, text) is
'Citus variant (installed by agentkeel distribute; SECURITY INVOKER): claims up to p_limit (1 to settings.max_batch_items) pending outbox messages of any tenant whose available_at has come, optionally only topics starting with p_topic_prefix, for p_relay until now + p_lease, by an unlocked candidate scan of message metadata as the relay login and then keel.claim_due_message for each candidate, on its tenant''s node. Fair across tenants: the first candidates are each tenant''s oldest due message, then each one''s second, and so on; the rest of the batch the oldest due messages of any tenant. Same contract as the PostgreSQL function: a new claim_token per message, rows locked by other transactions skipped, a message with a message_key not claimed while it is held or an earlier one of the same tenant and key is pending, dead instead after settings.outbox_max_unreported_claims claims with no ack or nack (G6).';
