"""Python face of rdmadev's remote-device core (C++, _native/core): the names the rest of
rdmadev uses, re-exported from the per-family extension modules in rdmadev._native.

One class per native object. Every object is a context manager with an idempotent close();
a parent closes its children in a fixed order (Domain: channel halves -> endpoints, each
with its remote regions -> regions -> itself) and holds only weak references to them; nothing
is raised from a destructor. Data never passes through Python: calls that move bytes or
wait release the GIL.
"""
from graph_pass.layout import Layout as _Layout
from graph_pass.native_rules import NativeRules as _NativeRules

from . import errors as _errors
from ._native import rules as _rules
from ._native.bench import bench_memcpy, bench_pingpong, bench_tcp_pingpong, bench_tcp_stream
from ._native.channel import (CREDIT_BYTES, RegionLease, RingLayout, RingReceiver, RingSender,
                              wire_layout)
from ._native.crypto import client_handshake, handshake_proof, hmac_sha256, server_handshake
from ._native.domain import (ANY_PEER, VERBS_STAGING_BYTES, Domain, error_kinds,
                             fabric_priority, recent_events, unviable_reason)
from ._native.endpoint import Endpoint, RemoteRegion
from ._native.region import Region
from ._native.registry import (LATE_WRITE_GRACE_S, PARKED_GRACE_S, RELEASED_GRACE_S,
                               VERDICT_WAIT_S,
                               bound_channels, channel_counts, channel_recv, channel_send,
                               channel_want, fail_half, growing_channels, half_held,
                               half_kept_on_tf, half_lost, keep_half_on_tf,
                               peer_verdict, release_drained, transfer_counts, unbind_channel,
                               unbind_domain, unbind_peer, unfail_half)

__all__ = [
    "Domain", "Region", "Endpoint", "RemoteRegion", "RingLayout", "RingSender", "RingReceiver",
    "CREDIT_BYTES", "ANY_PEER", "wire_layout", "error_kinds", "unbind_channel",
    "bound_channels", "channel_send", "channel_recv", "channel_want", "growing_channels",
    "fail_half", "unfail_half", "keep_half_on_tf", "half_kept_on_tf", "half_held", "half_lost",
    "RegionLease", "unbind_domain", "unbind_peer",
    "peer_verdict",
    "release_drained", "PARKED_GRACE_S", "RELEASED_GRACE_S", "LATE_WRITE_GRACE_S",
    "VERDICT_WAIT_S", "VERBS_STAGING_BYTES",
    "channel_counts", "transfer_counts", "fabric_priority", "unviable_reason", "recent_events", "hmac_sha256",
    "handshake_proof", "client_handshake", "server_handshake", "bench_memcpy",
    "bench_pingpong", "bench_tcp_pingpong", "bench_tcp_stream", "LAYOUT", "PLANNER_RULES",
]

#: The layout of receive regions as the native protocol writes it (channel.h, through
#: wire_layout()): what the planner and the control plane lay rings and regions out with.
LAYOUT = _Layout(**wire_layout())
#: What graph_pass must decide exactly as the native passes do (rules.h, channel.h): the
#: ``rules`` rdmadev hands the planner (graph_pass.plan_partitions(..., rules=PLANNER_RULES)).
PLANNER_RULES = _NativeRules(layout=LAYOUT, send_ops=_rules.SEND_OPS, recv_ops=_rules.RECV_OPS,
                             crosses_tasks=_rules.crosses_tasks, branch_mark=_rules.BRANCH_MARK,
                             bound_attr=_rules.BOUND_ATTR, trusted_output=_rules.trusted_output,
                             kernel_device=_rules.kernel_device)

# Fails the import if the core has an error kind rdmadev/errors.py does not map.
_errors._bind_native_kinds(error_kinds())
