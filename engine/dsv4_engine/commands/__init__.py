"""`dsv4-engine` subcommands, one module each (see dsv4_engine.cli)."""
