"""The agentkeel conformance suite: proves a database enforces the guarantees G1-G12.

Run it with `agentkeel conformance [--dsn DSN]`, or
`pytest -p agentkeel_conformance.plugin --pyargs agentkeel_conformance [--keel-dsn DSN]`.
"""
