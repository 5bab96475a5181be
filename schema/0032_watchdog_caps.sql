-- Limits the database enforces from outside an agent's session (G7): role settings such as
-- statement_timeout are only defaults, which the session itself may lift (SET, or ALTER
-- ROLE on its own login). keel.watchdog ends the backends of keel_agent and keel_worker
-- members past these caps, in seconds, whatever the session set; `agentkeel check`
-- (role_timeouts) refuses role settings above them.
insert into keel.settings (setting, value, description)
values
(
    'agent_max_statement_seconds', '30',
    'Longest statement of a keel_agent member''s backend before keel.watchdog ends it (G7).'
),
(
    'agent_max_transaction_seconds', '60',
    'Longest open transaction of a keel_agent member''s backend before keel.watchdog ends it (G7).'
),
(
    'agent_max_idle_in_transaction_seconds', '30',
    'Longest idle time inside a transaction of a keel_agent member''s backend before keel.watchdog ends it (G7).'
),
(
    'worker_max_statement_seconds', '120',
    'Longest statement of a keel_worker member''s backend before keel.watchdog ends it (G7).'
),
(
    'worker_max_transaction_seconds', '600',
    'Longest open transaction of a keel_worker member''s backend before keel.watchdog ends it (G7).'
),
(
    'worker_max_idle_in_transaction_seconds', '120',
    'Longest idle time inside a transaction of a keel_worker member''s backend before keel.watchdog ends it (G7).'
);
