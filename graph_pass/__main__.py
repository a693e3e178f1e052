"""``python -m graph_pass [plan] ...``: the same as ``rdmadev plan ...`` (see graph_pass.cli)."""

import sys

from .cli import main

if __name__ == "__main__":
    _argv = sys.argv[1:]
    sys.exit(main(_argv[1:] if _argv[:1] == ["plan"] else _argv))
