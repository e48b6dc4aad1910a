"""Subcommands that live beside their subsystems: serve, bench, simulate, profile."""

from __future__ import annotations

import argparse


def register_all(sub: argparse._SubParsersAction) -> None:
    """Each subsystem adds its own subcommand; imported lazily so `heddle --help` stays fast."""
