"""`python -m agentkeel.cli`."""

from agentkeel.cli import main

main()
