"""``parcel-hpc``: the subcommands of ``parcel_hpc.commands.COMMANDS``. Parsing and exit codes only.

The parser is built from the registry; only the command that runs has its module imported (each
pulls in h5py, pyarrow, matplotlib or submitit, and ``parcel-hpc status`` should not pay for all
of them). ``parcel-hpc --help`` lists every command from the registry's one-line help.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Collection, Sequence

from parcel_hpc import fsio
from parcel_hpc.commands import BY_NAME, COMMANDS
from parcel_hpc.errors import exit_on_error


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]  # one line and exit 2, like every other bad input
        command = self.prog.split()[-1] if " " in self.prog else ""
        print(f"error: {message}; see `parcel-hpc {command + ' ' if command else ''}--help`", file=sys.stderr)
        raise SystemExit(2)


def build_parser(loaded: Collection[str] | None = None) -> argparse.ArgumentParser:
    """Every command listed; the arguments of those in ``loaded`` (None: all) added, and only their
    modules imported."""
    p = _Parser(prog="parcel-hpc", description="Governed model searches on SLURM clusters (the search itself: python -m parcel_hpc.launch -m).")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")
    for command in COMMANDS:
        s = sub.add_parser(command.name, help=command.help, description=command.help)
        if loaded is None or command.name in loaded:
            command.load().add_arguments(s)
    return p


def main(argv: Sequence[str] | None = None) -> None:
    fsio.no_world_writes()
    args_list = list(sys.argv[1:] if argv is None else argv)
    chosen = next((a for a in args_list if not a.startswith("-")), "")
    args = build_parser({chosen} & BY_NAME.keys()).parse_args(args_list)
    module = BY_NAME[args.command].load()
    code = 0
    try:
        with exit_on_error():
            code = module.run(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # `parcel-hpc status --json | head`: the reader left; end quietly (Python's own advice:
        # point stdout at devnull so the flush at exit does not raise again).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(0) from None
    raise SystemExit(code)


if __name__ == "__main__":
    main()
