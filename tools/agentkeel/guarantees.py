"""The guarantees G1-G12: their ids and titles, the suite's table of contents.

Here, not in the suite's package, so that `agentkeel conformance` can refuse an unknown
`--guarantee` before pytest starts (agentkeel_conformance imports agentkeel, never the
other way round).
"""

from __future__ import annotations

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


def parse_guarantees(value: str) -> frozenset[str]:
    """The ids a `--guarantee` value names ("g1, G5" -> {"G1", "G5"}); ValueError, with the
    message to show, for an empty value or an unknown id."""
    gids = [g.strip().upper() for g in value.split(",") if g.strip()]
    unknown = [g for g in gids if g not in GUARANTEES]
    if not gids or unknown:
        raise ValueError(
            f"--guarantee: unknown guarantee {', '.join(unknown) or repr(value)}"
            f" (one or more of {', '.join(GUARANTEES)}, comma-separated)"
        )
    return frozenset(gids)
