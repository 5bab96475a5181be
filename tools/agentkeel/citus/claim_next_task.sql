-- Leases with fencing (G5), on Citus: claim the next due task of any tenant.
-- Installed by `agentkeel distribute` in place of the SECURITY DEFINER
-- functions/claim_next_task.sql: it is keel.claim_next_tasks with a limit of one, and as a
-- definer function it would run that claim as keel_owner, which may not log in on a
-- cluster. Run as its caller, it calls the SECURITY INVOKER variant of
-- keel.claim_next_tasks as the worker login. The body is the shipped one.
alter function keel.claim_next_task(text, interval, text) security invoker;

comment on function keel.claim_next_task(text, interval, text) is
'Citus variant (installed by agentkeel distribute): the shipped keel.claim_next_task run as its caller (SECURITY INVOKER), so that the claim (keel.claim_next_tasks, Citus variant) runs as the worker login. Leases the task of any tenant that has been due longest, or returns no row (G5).';
