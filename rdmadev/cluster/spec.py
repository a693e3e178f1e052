"""Cluster specs: the one reader of every form a TF cluster spec comes in.

Pure Python (no TensorFlow): the control plane reads specs and must not import TF. A
``tf.train.ClusterSpec`` is read through its ``as_dict()``, so TF's own object is accepted
without importing TF here.

Example:
    >>> parse_cluster('{"ps": ["10.0.0.1:2222"], "worker": ["10.0.0.2:2222", "10.0.0.3:2222"]}')
    {'ps': ['10.0.0.1:2222'], 'worker': ['10.0.0.2:2222', '10.0.0.3:2222']}
    >>> parse_cluster({"worker": {1: "h:3", 0: "h:2"}})     # TF's sparse form
    {'worker': ['h:2', 'h:3']}
"""
import json
import os

from ..errors import ConfigError

__all__ = ["parse_cluster", "tf_config_task", "split_address"]

FORM_HINT = 'pass {"job": ["host:port", ...], ...}'
TF_CONFIG_HINT = ('set TF_CONFIG=\'{"cluster": {"ps": ["host:port"], "worker": [...]}, '
                  '"task": {"type": "worker", "index": 0}}\' or pass --cluster')


def _tf_config(env):
    """TF_CONFIG parsed as a dict, or None when unset.

    Raises:
        ConfigError: TF_CONFIG is set but is not a JSON object.
    """
    text = (os.environ if env is None else env).get("TF_CONFIG", "")
    if not text:
        return None
    try:
        config = json.loads(text)
    except ValueError as e:
        raise ConfigError(f"TF_CONFIG is not valid JSON: {e}", hint="fix TF_CONFIG's JSON") from None
    if not isinstance(config, dict):
        raise ConfigError(f"TF_CONFIG is not valid JSON with a 'cluster' key: {text[:80]!r}",
                          hint=TF_CONFIG_HINT)
    return config


def tf_config_task(env=None):
    """(job, index) of TF_CONFIG's ``task``, each None when absent.

    Raises:
        ConfigError: TF_CONFIG is set but malformed.
    """
    task = (_tf_config(env) or {}).get("task") or {}
    if not isinstance(task, dict):
        raise ConfigError(f"TF_CONFIG's task is {task!r}, not an object",
                          hint=TF_CONFIG_HINT)
    index = task.get("index")
    if index is None:
        return task.get("type"), None
    try:
        return task.get("type"), int(index)
    except (TypeError, ValueError):
        raise ConfigError(f"TF_CONFIG's task index {index!r} is not an integer",
                          hint=TF_CONFIG_HINT) from None


def split_address(address, job=None):
    """(host, port) of one ``host:port`` task address (``[v6]:port`` too).

    Args:
        address: e.g. ``"10.0.0.1:2222"``.
        job: the job it belongs to, named in the error.
    Raises:
        ConfigError: naming the job and the bad entry.
    """
    host, sep, port = address.rpartition(":") if isinstance(address, str) else ("", "", "")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        where = f"cluster spec job {job!r}: " if job is not None else ""
        raise ConfigError(f"{where}{address!r} is not a host:port address (port 1-65535)",
                          hint=FORM_HINT)
    return host, int(port)


def parse_cluster(cluster=None, env=None):
    """A cluster spec as ``{job: [address, ...]}``.

    Args:
        cluster: a dict ``{job: [address, ...]}`` or ``{job: {index: address}}``, its JSON text,
            a ``tf.train.ClusterSpec`` (anything with ``as_dict()``), or None for TF_CONFIG's.
        env: the environment to read TF_CONFIG from (default: ``os.environ``).
    Returns:
        ``{job: [address, ...]}`` with every address checked to be ``host:port``.
    Raises:
        ConfigError: naming what is wrong (the job and the entry) and the expected form.
    """
    if cluster is None:
        config = _tf_config(env)
        if config is None:
            raise ConfigError("no cluster spec: neither given nor in TF_CONFIG", hint=TF_CONFIG_HINT)
        cluster = config.get("cluster")
        if cluster is None:
            raise ConfigError("TF_CONFIG is not valid JSON with a 'cluster' key", hint=TF_CONFIG_HINT)
    if isinstance(cluster, (str, bytes)):
        try:
            cluster = json.loads(cluster)
        except ValueError as e:
            raise ConfigError(f"cluster spec is not valid JSON: {e}", hint=FORM_HINT) from None
    if hasattr(cluster, "as_dict"):
        cluster = cluster.as_dict()
    if not isinstance(cluster, dict) or not cluster:
        raise ConfigError(f"cluster spec must be a non-empty mapping, got {cluster!r}", hint=FORM_HINT)
    out = {}
    for job, addrs in cluster.items():
        if isinstance(addrs, dict):  # TF's sparse form {index: address}; indices must be 0..n-1
            try:
                indices = sorted(addrs, key=int)
            except (TypeError, ValueError):
                raise ConfigError(f"cluster spec job {job!r}: task indices {list(addrs)} are not "
                                  "integers", hint=FORM_HINT) from None
            if [int(i) for i in indices] != list(range(len(indices))):
                raise ConfigError(f"cluster spec job {job!r}: task indices {indices} are not 0..{len(indices) - 1}",
                                  hint="list every task of the job")
            addrs = [addrs[i] for i in indices]
        if not isinstance(addrs, (list, tuple)):
            raise ConfigError(f"cluster spec job {job!r}: {addrs!r} is not a list of host:port",
                              hint=FORM_HINT)
        for address in addrs:
            split_address(address, job)
        out[str(job)] = list(addrs)
    return out
