-- Recovery (G5): every takeover of a lease that expired unreleased counts, not only the
-- recoverer's (keel.claim_locked_task counts them; keel.claim_next_tasks stops offering a
-- task at the maximum).
comment on column keel.tasks.recovery_attempts is
'How many times the task was taken over after its lease expired unreleased, by keel.recover_stale_tasks or by a claim (keel.claim_locked_task counts both). At settings.max_recovery_attempts claims stop offering the task and the recoverer fails it (RECOVERY_EXHAUSTED).';
