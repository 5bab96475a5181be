"""The guarantees G1-G12 (defined in agentkeel.guarantees, which the CLI shares)."""

from agentkeel.guarantees import GUARANTEES, parse_guarantees

__all__ = ["GUARANTEES", "parse_guarantees"]
