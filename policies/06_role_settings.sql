-- No transaction across external calls (G7): short defaults for the roles that act.
-- PostgreSQL applies role settings to the role a session logs in as, not to the groups
-- it belongs to: copy these onto login roles (README: "Roles"), overriding as needed.
alter role keel_agent set statement_timeout = '5s';
alter role keel_agent set lock_timeout = '2s';
alter role keel_agent set idle_in_transaction_session_timeout = '10s';
alter role keel_worker set statement_timeout = '30s';
alter role keel_worker set lock_timeout = '5s';
alter role keel_worker set idle_in_transaction_session_timeout = '30s';
