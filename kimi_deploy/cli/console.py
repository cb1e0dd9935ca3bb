"""The rich console of the verbs that draw tables and progress (``check``, ``bench``, ``restart``).

rich's own answer to a closed stdout is ``SystemExit(1)`` (``Console.on_broken_pipe``), which this kit's exit
codes read as "a check failed". :class:`Console` raises the ``BrokenPipeError`` instead, so that the CLI edge
(:meth:`kimi_deploy.cli.KimiGroup.invoke`) ends the verb the way it ends every other one: quietly, exit 0.
"""

from __future__ import annotations

from rich.console import Console as RichConsole


class Console(RichConsole):
    """rich's :class:`rich.console.Console`, leaving a closed stdout to the CLI edge."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError("stdout closed")
