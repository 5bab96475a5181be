-- Size, depth and wake-time limits read by the payload and schedule checks (G9, G5).
insert into keel.settings (setting, value, description)
values
(
    'max_payload_depth', '64',
    'Deepest nesting of objects and arrays any stored payload may have; deeper payloads are refused before any other work (G9).'
),
(
    'max_outbox_message_bytes', '65536',
    'Largest outbox message (topic, key, payload and headers), in bytes of its JSON text (G9).'
),
(
    'max_operation_result_bytes', '65536',
    'Largest operation result or error, in bytes of its JSON text (G9).'
),
(
    'max_task_metadata_bytes', '16384',
    'Largest task metadata object, in bytes of its JSON text (G9).'
),
(
    'max_wake_delay', '366 days',
    'Latest wake time a caller may ask for, as an interval after now; earlier than now means now (G5).'
);

update keel.settings
set description = 'Largest event payload, in bytes of its JSON text (G9).'
where setting = 'max_event_payload_bytes';
