"""Opening this process's remote-device domain with the configured fabrics.

Example:
    >>> import rdmadev
    >>> with rdmadev.open_domain("worker:0") as dom:
    ...     region = dom.allocate(1 << 20)
    ...     print(dom.address, region.descriptor.hex()[:16])
"""
import logging
import secrets

from . import _core
from .config import Config, with_variable_names
from .errors import ConfigError, FabricError

__all__ = ["open_domain", "viable_fabrics", "fabric_report"]

log = logging.getLogger(__name__)
log.addHandler(logging.NullHandler())

# Bytes of a generated cluster secret: 256 bits, the HMAC-SHA256 key size.
GENERATED_SECRET_BYTES = 32


def _native(config, call, *args, **kwargs):
    """Calls into the core; a fabric's ConfigError comes back naming the variable."""
    try:
        return call(*args, **kwargs)
    except ConfigError as e:
        raise with_variable_names(e, config) from None


def fabric_report(config=None):
    """[(fabric, viable, reason)] for every registered fabric, best first. Never raises for
    bad configuration: a fabric whose options are malformed is reported not viable, with
    the error naming the variable as its reason (opening a domain raises it).

    Args:
        config: a Config whose fabric options the fabrics judge (default: Config.from_env(),
            or the defaults when the environment is invalid; `rdmadev doctor` reports that).
    Example:
        >>> [name for name, ok, why in fabric_report()]
        ['shm', 'verbs', 'tcp']
    """
    cfg = config
    if cfg is None:
        try:
            cfg = Config.from_env()
        except ConfigError:
            cfg = Config()
    options = cfg.fabric_options()
    out = []
    for name in _core.fabric_priority():
        try:
            why = _core.unviable_reason(name, options)
        except ConfigError as e:
            why = str(with_variable_names(e, cfg))
        out.append((name, not why, why))
    return out


def viable_fabrics(config=None):
    """Names of the fabrics this process can open (with `config`'s fabric options), best first."""
    return [name for name, ok, _ in fabric_report(config) if ok]


def _resolve(fabric, cfg):
    if fabric == "auto":
        names = viable_fabrics(cfg)
        if not names:
            raise FabricError("no fabric is viable in this process",
                              hint="run `rdmadev doctor` to see why each fabric is not viable")
        return names
    why = _native(cfg, _core.unviable_reason, fabric, cfg.fabric_options())
    if why:
        raise FabricError(f"RDMADEV_FABRIC={fabric} is not viable here: {why}",
                          hint="use RDMADEV_FABRIC=auto, or run `rdmadev doctor`")
    return [fabric]


def open_domain(name, config=None, fabrics=None, tcp_addr=None):
    """Opens the remote-device domain of this process.

    Args:
        name: this task's identity as peers see it (e.g. "worker:0").
        config: a Config (default: Config.from_env()).
        fabrics: fabric names to open, overriding config.fabric ("auto" = all viable).
        tcp_addr: host:port for the tcp fabric, overriding config.tcp_addr.
    Returns:
        rdmadev._core.Domain.
    Raises:
        ConfigError, FabricError.
    """
    cfg = config or Config.from_env()
    names = _resolve(cfg.fabric, cfg) if fabrics is None else [
        n for f in fabrics for n in _resolve(f, cfg)]
    secret = cfg.secret
    if not secret:
        secret = secrets.token_bytes(GENERATED_SECRET_BYTES)
        if "tcp" in names or "verbs" in names:
            log.info("no RDMADEV_SECRET set: generated one; tcp/verbs peers in other processes "
                     "will fail authentication unless they share it")
    return _native(cfg, _core.Domain, name, names, secret=secret,
                   tcp_listen=tcp_addr or cfg.tcp_addr, spin_us=cfg.spin_us, yield_us=cfg.yield_us,
                   fabric_options=cfg.fabric_options(),
                   max_registered_bytes=cfg.max_registered_bytes,
                   stage_below_slot_bytes=cfg.stage_below_slot_bytes)
