"""`dsv4ctl` subcommands: one module each, exposing ``register(subparsers)`` (see
``dsv4_engine.cliutil``).  Modules are discovered, so a new subcommand touches only its file.
"""
