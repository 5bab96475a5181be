-- Roles (G1): NOLOGIN group roles; a DBA grants them to login roles.
do $$
declare
    v_role text;
begin
    foreach v_role in array array[
        'keel_owner', 'keel_migrator', 'keel_app', 'keel_worker', 'keel_relay', 'keel_agent',
        'keel_auditor', 'keel_watchdog'
    ] loop
        if not exists (select from pg_catalog.pg_roles as r where r.rolname = v_role) then
            execute format('create role %I nologin', v_role);
        end if;
    end loop;
    -- Whoever installs agentkeel hands every object to keel_owner, which needs membership.
    if not pg_catalog.pg_has_role(current_user, 'keel_owner', 'member') then
        execute format('grant keel_owner to %I', current_user);
    end if;
end;
$$;

grant keel_owner to keel_migrator;

comment on role keel_owner is
'agentkeel: owns every keel object; runs retention and tenant deletion. NOLOGIN, on Citus on every node too: no node may be reached as the owner of the tables (agentkeel distribute sees to it).';
comment on role keel_migrator is 'agentkeel: applies migrations (member of keel_owner).';
comment on role keel_app is
'agentkeel: trusted server code; calls the function API for the tenant it sets with SET LOCAL keel.tenant_id.';
comment on role keel_worker is
'agentkeel: claims work across tenants (keel.claim_next_task), then acts within the claimed tenant.';
comment on role keel_relay is 'agentkeel: claims, acks and nacks outbox rows only.';
comment on role keel_agent is
'agentkeel: untrusted generated SQL; its tenant only, through a signed token (set_config(''keel.tenant_token'', $1, true), then keel.bind_tenant_context()).';
comment on role keel_auditor is 'agentkeel: reads task events of every tenant.';
comment on role keel_watchdog is
'agentkeel: runs keel.watchdog, which ends agent and worker backends past the caps in keel.settings. Its logins also need pg_read_all_stats and pg_signal_backend (agentkeel bootstrap --watchdog-login grants them).';
