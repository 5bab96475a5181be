-- Leases with fencing (G5): claim the next due task of any tenant.
-- keel.claim_next_tasks with a limit of one: the one cross-tenant claim, written once. On
-- Citus its variant replaces keel.claim_next_tasks and this function stays as it is.
-- agentkeel:requires functions/claim_next_tasks.sql
create or replace function keel.claim_next_task(
    p_owner text,
    p_lease interval default '30 seconds',
    p_workflow text default null
)
returns setof keel.tasks
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    return query select * from keel.claim_next_tasks(p_owner, 1, p_lease, p_workflow);
end;
$$;

comment on function keel.claim_next_task(text, interval, text) is
'Leases the task of any tenant that has been due longest (wake_at <= now, no valid lease), optionally of one workflow: keel.claim_next_tasks with a limit of one. Rows locked by other transactions are skipped, so it returns a task whenever any unlocked due task exists; concurrent claimers never wait on or share a task. Sets the claimed task''s tenant as the transaction''s context. Returns no row when nothing claimable is due.';
