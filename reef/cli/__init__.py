"""The `reef` command: one module per command group, `main` dispatches to them."""

from reef.cli.main import main

__all__ = ["main"]
