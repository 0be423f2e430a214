"""The `staleness` command.

Every sub-command validates its input at the boundary: a bad argument prints
one line (`staleness: error: ...`) and exits with status 2, no traceback.
"""

from __future__ import annotations

import argparse
import sys

from staleness.infra import interrupts
from staleness.infra.checks import ArgumentError
from staleness.cli.common import Parser, UsageError
from staleness.cli import pipeline_cmd, plan_cmd, run_cmd, schedule_cmd, simulate_cmd, sweep_cmd

__all__ = ["main", "entry"]


def build_parser() -> argparse.ArgumentParser:
    from staleness import __version__

    parser = Parser(prog="staleness", description="Stale-synchronous distributed training: simulate, compare, run.")
    parser.add_argument("--version", action="version", version=f"staleness {__version__}")
    sub = parser.add_subparsers(dest="command", parser_class=Parser)
    parser.commands = sub.choices   # command name -> its Parser
    schedule_cmd.add(sub)
    plan_cmd.add(sub)       # plan (asynchronous RL: throughput vs staleness, timing only)
    simulate_cmd.add_simulate(sub)
    simulate_cmd.add_compare(sub)
    run_cmd.add(sub)        # run, launch, replay (real devices and hosts)
    pipeline_cmd.add(sub)   # pipeline (layer-wise staleness)
    sweep_cmd.add(sub)      # sweep (a grid in one compiled replay; devices, processes)
    return parser


def entry() -> None:
    """The `staleness` console script: `main`, then exit with its status. A command
    that failed or was interrupted exits at once (`os._exit`, after flushing): JAX
    threads may still be compiling or running (an interrupted compile, a peer process
    that died), and finalizing the interpreter under them can crash it (a segfault,
    or XLA's distributed client aborting) after everything was written."""
    code = main()
    if code != 0:
        import logging
        import os

        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def main(argv=None) -> int:
    # Ctrl-C stops the run and keeps what was recorded, also when SIGINT was inherited as ignored (a
    # background process of a non-interactive shell) or swallowed by a callback (`staleness.infra.interrupts`).
    interrupts.install()
    parser = build_parser()
    try:
        args = parser.parse_args(_attach_dash_values(parser, sys.argv[1:] if argv is None else list(argv)))
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        return int(args.func(args) or 0)
    except ArgumentError as e:   # a library's argument, named as the flag it came from
        print(f"staleness: error: {e.render(_flag(parser, sys.argv[1:] if argv is None else argv, e.name))}",
              file=sys.stderr)
        return 2
    except (UsageError, ValueError, OSError) as e:  # OSError: a file or directory that cannot be used
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"staleness: error: {msg}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `staleness schedule | head`
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("staleness: interrupted", file=sys.stderr)
        return 130


def _flag(parser: argparse.ArgumentParser, argv, name: str) -> str:
    """The flag of keyword argument `name` in the sub-command `argv` names."""
    command = next((a for a in argv if not a.startswith("-")), None)
    sub = parser.commands.get(command) if command else None
    return sub.flag_of(name) if sub is not None else name


def _attach_dash_values(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """Write `--opt VALUE` as `--opt=VALUE` when VALUE starts with '-' and is not an
    option itself (e.g. `--cluster -1,1`), so argparse hands the value to the
    option's own checks instead of failing with "expected one argument"."""
    takes_value = set()
    for action in _all_actions(parser):
        if action.option_strings and action.nargs is None and not isinstance(
                action, (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._VersionAction,
                         argparse._HelpAction, argparse._StoreConstAction, argparse._CountAction)):
            takes_value.update(action.option_strings)
    known = {o for a in _all_actions(parser) for o in a.option_strings}
    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        if (a in takes_value and i + 1 < len(argv) and argv[i + 1].startswith("-")
                and argv[i + 1].split("=", 1)[0] not in known):
            out.append(f"{a}={argv[i + 1]}")
            i += 2
            continue
        out.append(a)
        i += 1
    return out


def _all_actions(parser: argparse.ArgumentParser):
    for action in parser._actions:
        yield action
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _all_actions(sub)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
