"""kvcxl.cli: the command line, the part above every other.

:mod:`kvcxl.cli.main` is the entry point; each other module registers one group of
subcommands (``register(subparsers)``) and assembles the parts it drives in its handlers.
No part imports this one (tests/test_architecture.py enforces it), so a part never
reaches up to another through the command line.
"""
