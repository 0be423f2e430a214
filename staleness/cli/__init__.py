"""The `staleness` command.

Every sub-command validates its input at the boundary: a bad argument prints
one line (`staleness: error: ...`) and exits with status 2, no traceback.
"""

from __future__ import annotations

import argparse
import signal
import sys

from staleness.cli.common import UsageError, _Parser
from staleness.cli import pipeline_cmd, run_cmd, schedule_cmd, simulate_cmd

__all__ = ["main"]


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="staleness", description="Stale-synchronous distributed training: simulate, compare, run.")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    schedule_cmd.add(sub)
    simulate_cmd.add_simulate(sub)
    simulate_cmd.add_compare(sub)
    run_cmd.add(sub)        # run, launch, replay (real devices and hosts)
    pipeline_cmd.add(sub)   # pipeline (layer-wise staleness)
    return parser


def main(argv=None) -> int:
    # A process started in the background by a non-interactive shell inherits
    # SIGINT as ignored, and Python then never raises KeyboardInterrupt. Our
    # commands promise that Ctrl-C (SIGINT) stops the run and keeps what was
    # recorded, so restore the default handler.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        return int(args.func(args) or 0)
    except (UsageError, ValueError, FileNotFoundError) as e:
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
