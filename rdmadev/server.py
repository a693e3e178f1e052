"""`python -m rdmadev.server`: the entry point of rdmadev.tf.server (`rdmadev serve`)."""
import sys

from .tf.server import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
