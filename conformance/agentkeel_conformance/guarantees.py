"""The guarantees G1-G12: their ids and titles, the suite's table of contents."""

GUARANTEES: dict[str, str] = {
    "G1": "Tenant isolation",
    "G2": "Idempotency",
    "G3": "Guarded transitions",
    "G4": "Append-only history",
    "G5": "Leases with fencing",
    "G6": "Outbox, at-least-once",
    "G7": "No transaction across external calls",
    "G8": "Durable step reuse",
    "G9": "Redaction",
    "G10": "Tenant deletion",
    "G11": "Retention",
    "G12": "Safe migrations",
}
