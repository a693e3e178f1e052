"""The `rdmadev` command: doctor, demo, plan.

Example:
    $ rdmadev doctor
    $ rdmadev demo
"""
import sys

__all__ = ["main"]

USAGE = """usage: rdmadev COMMAND [ARGS]

commands:
  doctor   what this machine offers rdmadev (fabrics, memlock and open-file limits, devices,
           TensorFlow)
  serve    start one TF task with rdmadev (see rdmadev serve --help)
  demo     two processes on this host move tensors through every viable fabric, checked
  plan     print and draw the transfer plan of a TF function (see rdmadev plan --help)
"""


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    cmd, rest = argv[0], argv[1:]
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
