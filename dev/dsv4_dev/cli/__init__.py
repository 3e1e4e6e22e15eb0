"""`dsv4ctl` subcommands this package adds through the `dsv4ctl.commands` entry points."""
