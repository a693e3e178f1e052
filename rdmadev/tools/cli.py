"""The `rdmadev` command: doctor, serve, demo, plan, --version.

Example:
    $ rdmadev doctor
    $ rdmadev demo
"""
import sys

__all__ = ["main"]

USAGE = """usage: rdmadev COMMAND [ARGS]
       rdmadev --version

commands:
  doctor   what this machine offers rdmadev (fabrics, memlock and open-file limits, devices,
           TensorFlow)
  serve    start one TF task with rdmadev (see rdmadev serve --help)
  demo     two processes on this host move tensors through every viable fabric, checked
  plan     print and draw the transfer plan of a TF function (see rdmadev plan --help)
"""


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


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "--version":
        print(version())
        return 0
    if cmd == "doctor":
        from .doctor import main as run
    elif cmd == "serve":
        from ..tf.server import main as run
    elif cmd == "demo":
        from .demo import main as run
    elif cmd == "plan":
        try:
            from graph_pass.cli import main as run
        except ImportError as e:
            print(f"rdmadev plan is unavailable: {e}", file=sys.stderr)
            return 2
    else:
        print(f"rdmadev: unknown command {cmd!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    return run(rest)


if __name__ == "__main__":
    sys.exit(main())
