-- The keel schema holds every agentkeel object; nothing is created elsewhere.
create schema if not exists keel;

comment on schema keel is
'agentkeel: tasks, events, operations and outbox for AI-agent workloads.';
