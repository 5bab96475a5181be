-- Outbox delivery (G6), on Citus: counts per topic across tenants, as the caller.
-- Installed by `agentkeel distribute` in place of the SECURITY DEFINER
-- functions/outbox_status.sql, which on the coordinator would reach the workers as
-- keel_owner (which may not log in on a cluster). Run as its caller, its multi-shard
-- SELECT of message metadata reaches them as the relay's own login, which reads those
-- columns of every tenant (policy outbox_relay_scan, column grants). The body is the
-- shipped one; its scan goes over one connection per worker, the one Citus keeps open
-- between statements (a pool of new connections per call, each with its TLS handshake,
-- cost more than the scan).
alter function keel.outbox_status() security invoker;

alter function keel.outbox_status() set "citus.max_adaptive_executor_pool_size" = 1;

comment on function keel.outbox_status() is
'Citus variant (installed by agentkeel distribute): the shipped keel.outbox_status run as its caller (SECURITY INVOKER). Per topic, across tenants: messages pending (waiting, in backoff or with an expired claim), in flight (claimed, claim not expired), dead, and the age of the oldest pending one. Counts only, no payload, no tenant id (G6).';
