-- The one registry of agentkeel SQLSTATEs. tools/agentkeel/errors.py mirrors it,
-- and a test keeps the two, and every ERRCODE raised in functions/, in step.
create or replace function keel.error_codes()
returns table (sqlstate text, name text, description text)
language plpgsql
immutable
parallel safe
set search_path = pg_catalog, pg_temp
as $$
begin
    return query
    select c.sqlstate, c.name, c.description
    from (
        values
        ('22K01', 'invalid_argument',
         'An argument is missing, out of range or malformed. Nothing was written.'),
        ('22K02', 'payload_rejected',
         'A stored payload (event, outbox message, operation result or error, task metadata) carries a secret-bearing key, nests deeper than the limit or exceeds its size limit (G9). The message names the key path, never the value. Nothing was written.'),
        ('23K01', 'idempotency_conflict',
         'The idempotency key was used before with a different input hash, action or task. The stored operation is unchanged.'),
        ('23K02', 'workflow_conflict',
         'The workflow version already exists with different states or edges. Workflow versions are immutable: define a new version.'),
        ('23K10', 'checkpoint_conflict',
         'The checkpoint id was saved before with another task or payload. The stored checkpoint is unchanged.'),
        ('42K01', 'tenant_context_missing',
         'No tenant context is set for this transaction: SET LOCAL keel.tenant_id (trusted roles) or keel.tenant_token (agents).'),
        ('42K02', 'unknown_tenant',
         'No tenant with that id exists.'),
        ('42K03', 'unknown_workflow',
         'No such workflow version has been defined.'),
        ('42K04', 'task_not_found',
         'No task with that id exists in the tenant.'),
        ('42K05', 'operation_not_found',
         'No operation with that id exists in the tenant.'),
        ('42K06', 'tenant_context_mismatch',
         'The tenant argument differs from the tenant context of the transaction.'),
        ('42K07', 'invalid_tenant_token',
         'The tenant token is malformed, expired, signed with an unknown or retired key, or its signature does not verify (for a token bound to a login: in this login''s session).'),
        ('42K08', 'message_not_found',
         'No outbox message with that id exists in the tenant.'),
        ('42K10', 'step_not_found',
         'The task has no such step, or the step has no open attempt: begin it with keel.begin_step first.'),
        ('42K11', 'data_key_not_found',
         'The tenant has no data key of that version.'),
        ('42K12', 'checkpoint_not_found',
         'No checkpoint with that id exists in the tenant.'),
        ('42K15', 'session_not_found',
         'No session with that id exists in the tenant: create it with keel.save_session first.'),
        ('54K01', 'quota_exceeded',
         'The write would take a tenant or an object past its quota: a tenant''s pending outbox messages, sessions or checkpoint bytes, a task''s checkpoints or step attempts (the tenant''s own limit in keel.tenant_quotas, else keel.settings), a session''s step updates or their bytes (keel.settings). Nothing was written.'),
        ('55K01', 'stale_state',
         'The task''s state_version is not the expected one: another writer changed it first. Nothing was written.'),
        ('55K02', 'illegal_transition',
         'The edge from the current state to the requested state is not legal for the task''s workflow version. Nothing was written.'),
        ('55K03', 'lease_lost',
         'The fencing token is not the current valid lease on the task (expired, released or taken over). Nothing was written.'),
        ('55K04', 'lease_held',
         'Another worker holds an unexpired lease on the task.'),
        ('55K05', 'operation_not_reserved',
         'The operation is not in the reserved state, so it cannot be completed or failed again.'),
        ('55K06', 'task_not_claimable',
         'The task is in a terminal state and cannot be leased.'),
        ('55K07', 'append_only_violation',
         'Task events are append-only: UPDATE and DELETE are refused, except by the retention purge (G4).'),
        ('55K08', 'outbox_claim_lost',
         'The claim token is not the current open claim on the outbox message (claimed again by another relay, released, nacked, delivered or dead). Nothing was written.'),
        ('55K09', 'message_not_dead',
         'Only a dead outbox message can be replayed. Nothing was written.'),
        ('55K10', 'data_key_destroyed',
         'The tenant''s data key of that version was destroyed (G10): what it encrypted can no longer be read or written.'),
        ('55K15', 'session_update_refused',
         'A session write would replace a completed or failed outcome with a non-terminal one, or a newer attempt''s outcome with an older one. Nothing was written.'),
        ('55K16', 'session_version_conflict',
         'The session is not at the version the save expected: another writer saved first. Nothing was written.'),
        ('55K17', 'tenant_deleted',
         'The tenant is being deleted, or was deleted (G10): every call for it is refused, and its id is never a tenant again. Nothing was written.')
    ) as c (sqlstate, name, description)
    order by c.sqlstate;
end;
$$;

comment on function keel.error_codes() is
'Every custom SQLSTATE agentkeel raises, with its name and meaning. Codes sit in the standard class that fits (22 data, 23 integrity, 42 access, 54 program limit, 55 prerequisite).';
