-- Recovery points (G8, G9): the size limit of a checkpoint payload.
insert into keel.settings (setting, value, description)
values (
    'max_checkpoint_payload_bytes', '16777216',
    'Largest checkpoint payload, in bytes of its ciphertext, that keel.save_checkpoint accepts (G9).'
);
