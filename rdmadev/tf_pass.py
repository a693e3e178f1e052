"""The module name the C++ pass imports (`_native/tf/pass.cc`); the bridge is rdmadev.tf.bridge.
Remove once pass.cc imports "rdmadev.tf.bridge"."""
from .tf.bridge import rewrites  # noqa: F401
