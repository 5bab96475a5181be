-- Tenant isolation (G1): which logins are trusted server code.
-- The one definition: keel.current_tenant() honours a plain keel.tenant_id only for these
-- sessions, and keel.require_tenant() lets them name the tenant of a call that has no
-- context yet. session_user decides, never current_user, so SET ROLE cannot promote an
-- untrusted login, and SECURITY DEFINER functions judge their caller. A SQL function with a
-- standard body: its names are bound when it is created, and the planner inlines it
-- (through keel.current_tenant) into every policy.
create or replace function keel.trusted_session()
returns boolean
language sql
stable
return (
    pg_catalog.pg_has_role(session_user, 'keel_app', 'member')
    or pg_catalog.pg_has_role(session_user, 'keel_worker', 'member')
    or pg_catalog.pg_has_role(session_user, 'keel_owner', 'member')
);

comment on function keel.trusted_session() is
'True when the login (session_user) is a member of keel_app, keel_worker or keel_owner: trusted server code, which sets its tenant context itself (G1). Every other login, keel_agent above all, must present a signed tenant token.';
