-- Idempotency (G2): reserve an operation before calling the provider (G7).
create or replace function keel.reserve_operation(
    p_tenant_id uuid,
    p_task_id uuid,
    p_idempotency_key text,
    p_action text,
    p_input_hash text,
    p_fencing_token bigint default null,
    p_retention interval default '7 days',
    p_trace_id text default null,
    p_span_id text default null
)
returns table (
    outcome text,
    operation_id uuid,
    state text,
    attempts integer,
    result jsonb,
    error jsonb,
    provider_reference text,
    reserved_fencing_token bigint
)
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
-- A plan made while keel.operations was nearly empty (a sequential scan, then the
-- cheapest) must not stay in use for the replay lookup as the table grows: measured with
-- `agentkeel bench --workload reserve --duration 20`, 2,500 -> 800 calls/s over a run,
-- until autovacuum's ANALYZE replaced the plan (tests/test_plans.py). A function's
-- settings hold for everything it calls, and plans made under them are kept: set only on
-- functions whose statements and callees are all key lookups or computation (the payload
-- check's join, planned without sequential scans, took 500 ms a call).
set enable_seqscan = off
as $$
#variable_conflict use_column
declare
    v_now timestamptz := clock_timestamp();
    v_expires timestamptz;
    v_op keel.operations;
    v_outcome text;
begin
    perform keel.require_tenant(p_tenant_id);
    perform keel.check_operation_request(
        p_idempotency_key, p_action, p_input_hash, p_task_id, p_fencing_token
    );
    v_expires := keel.interval_end('retention', p_retention, v_now, interval '10 years');

    if p_task_id is not null then
        -- FOR SHARE: a concurrent claim cannot move the lease until this commits (G5).
        perform keel.assert_lease(keel.lock_task(p_tenant_id, p_task_id, 'share'), p_fencing_token, v_now);
    elsif p_fencing_token is not null then
        raise exception using
            errcode = '22K01',
            message = 'a fencing token was given without a task',
            hint = 'Pass the task id the lease belongs to, or no token for an operation without a task.';
    else
        perform 1 from keel.tenants as t where t.tenant_id = p_tenant_id;
        if not found then
            raise exception using
                errcode = '42K02',
                message = format('unknown tenant %s', p_tenant_id);
        end if;
    end if;

    -- A replay reads its key and writes nothing, unless it retries: no row lock, and no
    -- insert that would wait on a transaction finishing the operation. A key's action, input
    -- hash and task never change and a stored outcome is final, so the read is enough; the
    -- transaction then commits without waiting for a WAL flush.
    -- Each round reads the key and inserts it when there is none (a new key, or one the
    -- retention purge removed meanwhile; on conflict another reservation inserted it
    -- first: read it again). A retry (state retryable) is one UPDATE that takes it only
    -- while the row is still retryable, so of concurrent retries one reserves and the
    -- others read what it left (in_progress, or a later state).
    for v_round in 1..3 loop
        select o.* into v_op
        from keel.operations as o
        where o.tenant_id = p_tenant_id and o.idempotency_key = p_idempotency_key;
        if not found then
            insert into keel.operations as o (
                tenant_id, task_id, idempotency_key, action, input_hash, state, attempts,
                reserved_fencing_token, trace_id, span_id, created_at, updated_at, expires_at
            )
            values (
                p_tenant_id, p_task_id, p_idempotency_key, p_action, p_input_hash, 'reserved', 1,
                p_fencing_token, p_trace_id, p_span_id, v_now, v_now, v_expires
            )
            on conflict on constraint operations_idempotency_key_key do nothing
            returning o.* into v_op;
            if found then
                v_outcome := 'reserved';
                exit;
            end if;
            -- Inserted by another reservation since the read: read it. (Under REPEATABLE
            -- READ a row committed after the snapshot stays unseen: the rounds run out.)
            continue;
        end if;

        perform keel.check_operation_replay(v_op, p_action, p_input_hash, p_task_id);

        if v_op.state <> 'retryable' then
            v_outcome := case when v_op.state = 'reserved' then 'in_progress' else v_op.state end;
            exit;
        end if;

        update keel.operations as o
        set
            state = 'reserved',
            error = null,
            attempts = o.attempts + 1,
            reserved_fencing_token = p_fencing_token,
            updated_at = v_now
        where o.tenant_id = p_tenant_id and o.operation_id = v_op.operation_id
            and o.state = 'retryable'
        returning o.* into v_op;
        if found then
            v_outcome := 'reserved';
            exit;
        end if;
        -- Another reservation took the retry between the read and the update: read again.
    end loop;
    if v_outcome is null then
        raise exception using
            errcode = '40001',
            message = format('idempotency key %s is being reserved concurrently', p_idempotency_key),
            hint = 'Retry the transaction.';
    end if;

    return query select
        v_outcome, v_op.operation_id, v_op.state, v_op.attempts, v_op.result, v_op.error,
        v_op.provider_reference, v_op.reserved_fencing_token;
end;
$$;

comment on function keel.reserve_operation(uuid, uuid, text, text, text, bigint, interval, text, text) is
'Reserves (tenant, idempotency key) for one logical operation (G2). outcome: reserved (perform the effect now), in_progress (reserved earlier and not finished: reconcile with the provider if reserved_fencing_token is older than yours), succeeded or failed (the stored result or error). Reusing the key with a different input hash, action or task raises idempotency_conflict (23K01) and changes nothing. Fenced by the task lease when p_task_id is given.';
