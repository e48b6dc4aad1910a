"""The `heddle` command: `heddle serve | generate | bench serve | simulate | profile | policies`.

`main` (heddle/cli/main.py) builds the parser; each subcommand's flags and runner live beside
its subsystem (heddle/server/args.py, heddle/bench/client.py, heddle/sim/cli.py) or here
(generate.py, profile.py); flags they share are in heddle/cli/flags.py, which imports no
subcommand.
"""

from __future__ import annotations

from heddle.cli.main import main

__all__ = ["main"]
