-- Quotas (G9): what one session may accumulate. keel.load_session folds every update of a
-- session, so a session with no bound on its updates costs its readers without bound.
-- The byte count starts at 0 for existing sessions: it counts updates applied from now on.
-- A constant default: PostgreSQL 11+ adds the column without rewriting or scanning the table.
alter table keel.sessions add column update_bytes bigint not null default 0;

comment on column keel.sessions.update_bytes is
'Bytes (JSON text of result and error) of the step updates applied to this session since migration 0041, counted under this row''s lock by keel.record_session_update against settings.max_session_total_update_bytes.';

insert into keel.settings (setting, value, description)
values
(
    'max_session_updates', '10000',
    'Most step updates one session takes (keel.record_session_update); past it updates are refused with quota_exceeded (54K01), so keel.load_session folds a bounded number (G9).'
),
(
    'max_session_total_update_bytes', '16777216',
    'Most bytes (JSON text of results and errors) of all step updates of one session; an update that would pass it is refused with quota_exceeded (54K01) (G9).'
);
