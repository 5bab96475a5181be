-- No transaction across external calls (G7): short defaults for the roles that act.
-- PostgreSQL applies role settings to the role a session logs in as, not to the groups
-- it belongs to: copy these onto login roles (docs/security.md, "Roles"), overriding as needed.
alter role keel_agent set statement_timeout = '5s';
alter role keel_agent set lock_timeout = '2s';
alter role keel_agent set idle_in_transaction_session_timeout = '10s';
alter role keel_worker set statement_timeout = '30s';
alter role keel_worker set lock_timeout = '5s';
alter role keel_worker set idle_in_transaction_session_timeout = '30s';

-- An agent transaction has a hard bound on how long it holds locks where the server can
-- enforce one (transaction_timeout, PostgreSQL 17+). Before 17 the bound is the two
-- timeouts above plus the design: claims skip locked rows, so an agent's locks stall only
-- rows of its own tenant (docs/security.md).
do $$
begin
    if pg_catalog.current_setting('server_version_num')::integer >= 170000 then
        execute 'alter role keel_agent set transaction_timeout = ''30s''';
    end if;
end;
$$;
