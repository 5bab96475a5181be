-- Privileges (G1, G3, G4): nothing for PUBLIC; application roles read under RLS and write
-- only through the guarded function API (SECURITY DEFINER), never with DML of their own.
revoke all on schema keel from public;
revoke all on all tables in schema keel from public;
revoke all on all sequences in schema keel from public;
revoke all on all functions in schema keel from public;

grant usage on schema keel
to keel_app, keel_worker, keel_relay, keel_agent, keel_auditor, keel_watchdog;

-- Reads. Rows are filtered by the tenant_isolation policies.
grant select on keel.tenants, keel.tasks, keel.task_events, keel.operations, keel.outbox,
keel.inbox, keel.outbox_events
to keel_app, keel_worker;
grant select on keel.task_events to keel_auditor;
-- What a tenant deletion keeps (G10): its record and its events' tombstones.
grant select on keel.tenant_deletions, keel.task_event_tombstones to keel_auditor;
grant select on keel.workflows, keel.workflow_transitions, keel.workflow_states
to keel_app, keel_worker, keel_auditor;
-- keel_agent has no table privilege at all: it reads through the functions below, which
-- take no free-form predicate, so it cannot EXPLAIN its way to other tenants' planner
-- statistics (most common values, histograms). The policies stay as the second wall.
revoke all on all tables in schema keel from keel_agent;
grant select on keel.settings, keel.redaction_rules to keel_app, keel_worker;

-- Evaluated inside the RLS policies, so every role that reads needs them.
grant execute on function
keel.current_tenant(),
keel.trusted_session(),
keel.context_stamp(),
keel.context_relayed(),
keel.verify_tenant_token(text),
keel.verify_context_proof(text),
keel.error_codes()
to keel_app, keel_worker, keel_relay, keel_agent, keel_auditor;

-- What was applied (G12): `agentkeel migrate status` and the suite's G12 tests, as any role.
grant execute on function keel.applied_migrations()
to keel_app, keel_worker, keel_relay, keel_agent, keel_auditor;

-- Binding a context to its transaction: every role that sets one.
grant execute on function keel.bind_tenant_context()
to keel_app, keel_worker, keel_relay, keel_agent, keel_auditor;
-- The plain tenant context for a transaction, in one statement with a bound parameter.
grant execute on function keel.use_tenant(uuid)
to keel_app, keel_worker, keel_relay, keel_agent, keel_auditor;
-- On Citus an agent's bind also turns its verified token into the workers' proof.
grant execute on function keel.context_proof(text) to keel_agent;

-- The declared global tables and the tenant tables: what `agentkeel check` reads as
-- whichever trusted role runs it.
grant execute on function keel.global_tables(), keel.tenant_tables()
to keel_app, keel_worker, keel_auditor;

-- keel_app: trusted server code, for the tenant in its context.
grant execute on function
keel.create_tenant(uuid, text),
keel.define_workflow(text, integer, text, jsonb, text, text[]),
keel.mint_tenant_token(uuid, interval, text),
keel.create_task(uuid, text, integer, uuid, timestamptz, jsonb, text, text, text),
keel.claim_lease(uuid, uuid, text, interval)
to keel_app;

-- keel_worker: claims across tenants, then works inside the claimed one.
grant execute on function
keel.claim_next_task(text, interval, text),
keel.claim_next_tasks(text, integer, interval, text),
keel.claim_lease(uuid, uuid, text, interval),
keel.create_task(uuid, text, integer, uuid, timestamptz, jsonb, text, text, text)
to keel_worker;

-- The recoverer (G5): takes over the stale tasks of every tenant, like the claim above.
grant execute on function keel.recover_stale_tasks(integer, text, text, integer) to keel_worker;
-- The per-tenant steps of the claim and the recoverer, and what their Citus variants
-- (SECURITY INVOKER, tools/agentkeel/citus/) call as the worker login.
grant execute on function
keel.claim_due_task(uuid, uuid, text, interval, text),
keel.recover_stale_task(uuid, uuid, text, integer),
keel.max_recovery_attempts(),
keel.check_actor(text),
keel.no_tenant(),
keel.refuse_acting_for_none(uuid, text)
to keel_worker;
grant execute on function
keel.check_claim_limit(integer),
keel.max_batch_items(),
keel.check_lease_request(text, interval, timestamptz),
keel.interval_end(text, interval, timestamptz, interval),
keel.set_claim_scan(boolean)
to keel_worker, keel_relay;
-- The shape check of the relay's batch of acks (keel.ack_outbox_messages, SECURITY
-- INVOKER), which runs as the relay login.
grant execute on function keel.check_batch(jsonb, text[]) to keel_relay;

-- Sessions of chat-loop agents: each call in its own tenant, terminal outcomes protected.
grant execute on function
keel.save_session(uuid, text, jsonb, text, uuid, bigint),
keel.record_session_update(uuid, text, text, text, integer, jsonb, jsonb, text),
keel.load_session(uuid, text)
to keel_app, keel_worker, keel_agent;

-- Everyone who acts on a task: every write is guarded, fenced and tenant-checked.
grant execute on function
keel.get_task(uuid, uuid),
keel.list_tasks(uuid, text, uuid, integer),
keel.task_history(uuid, uuid, bigint, integer),
keel.get_operation(uuid, uuid),
keel.renew_lease(uuid, uuid, bigint, interval),
keel.release_lease(uuid, uuid, bigint, timestamptz),
keel.transition_task(
    uuid, uuid, bigint, text, bigint, text, jsonb, jsonb, text, text, text, boolean, timestamptz
),
keel.reserve_operation(uuid, uuid, text, text, text, bigint, interval, text, text),
keel.transition_tasks(uuid, jsonb),
keel.reserve_operations(uuid, jsonb),
keel.complete_operation(uuid, uuid, bigint, jsonb, text),
keel.fail_operation(uuid, uuid, bigint, jsonb, boolean, text)
to keel_app, keel_worker, keel_agent;

-- Outbox delivery (G6): the function API of the consumers' side, for the tenant in context.
grant execute on function
keel.dead_outbox(uuid, text, uuid, integer),
keel.replay_outbox(uuid, uuid),
keel.inbox_accept(uuid, text, uuid)
to keel_app, keel_worker;

-- keel_relay: claims, acks, nacks, releases and replays outbox messages of every tenant,
-- and counts them; nothing else (no tenant write function).
grant execute on function
keel.claim_outbox(text, integer, interval, text),
keel.ack_outbox(uuid, uuid, bigint),
keel.ack_outbox_messages(jsonb),
keel.nack_outbox(uuid, uuid, bigint, text, boolean),
keel.release_outbox(uuid, uuid, bigint),
keel.relay_replay_outbox(uuid, uuid),
keel.outbox_status(),
keel.outbox_delivered(interval),
keel.promote_outbox_heads(uuid, text, integer)
to keel_relay;
-- The per-tenant step of the relay's claim (and one message alone); on Citus its variant
-- (SECURITY INVOKER) scans the metadata of every tenant's pending messages as the relay
-- login (policy outbox_relay_scan): never payloads or headers.
grant execute on function
keel.claim_due_message(uuid, uuid, text, interval, text),
keel.claim_due_messages(uuid, uuid[], text, interval, text),
keel.ack_tenant_outbox_messages(uuid, uuid[], bigint[])
to keel_relay;
-- The per-key step of the relay's sweep (keel.promote_outbox_heads), likewise.
grant execute on function keel.promote_outbox_head(uuid, text) to keel_relay;
-- The delivery columns too (attempts, claims, last_error, dead_at, delivered_at): the
-- relay logs the messages its claims found dead, `agentkeel relay dead list` pages through
-- them, and `agentkeel relay status` counts recent deliveries (keel.outbox_delivered);
-- `held`: on Citus the sweep (keel.promote_outbox_heads) scans the held keys as the relay.
grant select (
    tenant_id, message_id, topic, message_key, state, available_at, created_at, position,
    claimed_by, attempts, claims, last_error, dead_at, delivered_at, held
) on keel.outbox to keel_relay;
-- The delivery limits (outbox_max_unreported_claims): the relay checks a sink's duplicate
-- window against them at start.
grant select on keel.settings to keel_relay;

-- Durable steps and checkpoints (G8): whoever acts on a task, fenced by its lease. The
-- wrapped data keys are useless without the client's key provider; destroying them
-- (keel.destroy_tenant_data_keys, G10) is the owner's alone.
grant execute on function
keel.begin_step(uuid, uuid, text, text, bigint, interval),
keel.complete_step(uuid, uuid, text, bigint, jsonb, integer),
keel.fail_step(uuid, uuid, text, bigint, jsonb, boolean, interval, integer),
keel.list_step_attempts(uuid, uuid),
keel.save_checkpoint(
    uuid, uuid, uuid, bigint, text, integer, bytea, bytea, text, integer, text, interval
),
keel.latest_checkpoint(uuid, uuid, text),
keel.invalidate_checkpoint(uuid, uuid, bigint),
keel.tenant_data_key(uuid, integer),
keel.add_tenant_data_key(uuid, bytea, text)
to keel_app, keel_worker, keel_agent;

-- Limits enforced from outside an agent's session (G7): the watchdog ends agent and worker
-- backends past the caps; `agentkeel check` reads the caps as whichever trusted role runs it.
grant execute on function keel.watchdog(boolean) to keel_watchdog;
grant execute on function keel.watchdog_caps()
to keel_app, keel_worker, keel_auditor, keel_watchdog;
