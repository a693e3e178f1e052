"""CNN models for benchmarks/cnn.py, written on plain tf.Variables so the harness decides
where every weight lives (``Params``). See ``nets.MODELS``."""
from .layers import Params
from .nets import MODELS

__all__ = ["Params", "MODELS"]
