-- Guarded transitions (G3), on Citus: workflows are defined by the owner's login.
-- Installed by `agentkeel distribute` in place of the SECURITY DEFINER
-- functions/define_workflow.sql: a workflow lives in reference tables, a copy on every
-- node, and a write to them reaches every node over connections as the role that runs it.
-- As a SECURITY DEFINER function that role would be keel_owner, which may not log in on a
-- cluster (no login may ever act on a worker as the owner of the tables). So on Citus the
-- function runs as its caller: a login that is a member of keel_owner (the migrator)
-- defines workflows, as part of a deployment; keel_app logins get permission denied
-- (42501) on keel.workflows. The body, its checks and its errors are the shipped ones.
alter function keel.define_workflow(text, integer, text, jsonb, text, text[]) security invoker;

comment on function keel.define_workflow(text, integer, text, jsonb, text, text[]) is
'Citus variant (installed by agentkeel distribute): the shipped keel.define_workflow run as its caller (SECURITY INVOKER), because its reference-table writes reach every node as the role that runs them: call it as the owner''s login (a member of keel_owner, e.g. the migrator). Defines a workflow version: its initial state and legal [from, to] edges, idempotently (same definition: false; a different one: workflow_conflict, 23K02) (G3).';
