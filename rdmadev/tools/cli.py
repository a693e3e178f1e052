"""The `rdmadev` command: argparse subcommands doctor, serve, demo and plan, and --version.

Each subcommand's own options are parsed by its own program (``rdmadev doctor --help``
prints doctor's), imported only when it runs: ``rdmadev --version`` and the usage need
neither TensorFlow nor numpy.

Example:
    $ rdmadev doctor
    $ rdmadev demo --help
"""
import argparse
import sys

__all__ = ["main", "version", "build_parser", "COMMANDS"]


def _doctor(argv):
    from .doctor import main as run
    return run(argv)


def _serve(argv):
    from ..tf.server import main as run
    return run(argv)


def _demo(argv):
    from .demo import main as run
    return run(argv)


def _plan(argv):
    try:
        from .plan import main as run
    except ImportError as e:
        print(f"rdmadev plan is unavailable: {e}", file=sys.stderr)
        return 2
    return run(argv)


DESCRIPTION = "RPC-free tensor transfers for distributed TensorFlow over RDMA verbs, shm or tcp."

#: Subcommand -> (what it does, for the usage; ``run(argv) -> exit status``).
COMMANDS = {
    "doctor": ("what this machine offers rdmadev (fabrics, memlock and open-file limits, "
               "devices, TensorFlow)", _doctor),
    "serve": ("start one TF task with rdmadev", _serve),
    "demo": ("two processes on this host move tensors through every viable fabric, checked",
             _demo),
    "plan": ("print and draw the transfer plan of a TF function", _plan),
}


def version():
    """"rdmadev X (built against TensorFlow Y)": the package and what its op library was
    built against (setup.py's record), without importing TensorFlow."""
    from .. import __version__
    try:
        from .._build_info import TF_VERSION
        built = f"built against TensorFlow {TF_VERSION}"
    except ImportError:
        built = "native library not built"
    return f"rdmadev {__version__} ({built})"


def build_parser():
    """The `rdmadev` parser: one subparser per COMMANDS entry, whose arguments are left for
    the subcommand's own parser (its --help included)."""
    ap = argparse.ArgumentParser(prog="rdmadev", description=DESCRIPTION,
                                 epilog="`rdmadev COMMAND --help` describes a command's options.")
    ap.add_argument("--version", action="version", version=version(),
                    help="print rdmadev's version and the TensorFlow it was built against")
    commands = ap.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for name, (summary, _) in COMMANDS.items():
        commands.add_parser(name, help=summary, description=summary, add_help=False)
    return ap


def main(argv=None):
    """Runs `rdmadev` with `argv` (default ``sys.argv[1:]``).

    Returns:
        The exit status: the subcommand's; 0 for the usage, a --help or --version; 2 for an
        unknown command or option (argparse's message on stderr).
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = build_parser()
    try:
        named = next((a for a in argv if not a.startswith("-")), None)  # rdmadev's take none
        if named is not None and named not in COMMANDS:
            ap.error(f"unknown command {named!r} (the commands: {', '.join(COMMANDS)})")
        args, rest = ap.parse_known_args(argv)
        if args.command is None:
            if rest:
                ap.error(f"unrecognized arguments: {' '.join(rest)}")
            ap.print_help()
            return 0
        if argv.index(args.command) > 0:  # options before the command are rdmadev's own
            ap.error(f"unrecognized arguments: {' '.join(argv[:argv.index(args.command)])}")
        return COMMANDS[args.command][1](rest)
    except SystemExit as e:  # --help, --version, or argparse's error (status 2), a command's too
        return e.code


if __name__ == "__main__":
    sys.exit(main())
