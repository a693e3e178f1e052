"""Channel setup between tasks, both halves.

The receiving task allocates the ring region exactly as planned and hands its descriptor to
the sender; the sender attaches it, allocates its credit word and hands that back; both bind
the channel under the plan's key, where the TF ops find it. ``open_channel`` drives the three
control requests from the process that planned; ``ChannelTable`` serves them in each task.

Example:
    >>> fabric = open_channel(rt.call, instance, transfer, region_bytes, allocated)
"""
import threading

from graph_pass.devices import split_task

from .. import _core

__all__ = ["ChannelTable", "open_channel", "open_channels", "REQUESTS", "CREDIT_BYTES"]

#: Bytes of a sender's credit region (C++ kCreditBytes in channel.h: one cache line).
CREDIT_BYTES = _core.CREDIT_BYTES

#: The control requests ChannelTable serves (the runtime routes them here).
REQUESTS = ("alloc_region", "send_channel", "recv_channel")


def _layout(request):
    """The ring layout a channel request carries: the plan's, field for field."""
    return _core.RingLayout(request["slots"], request["slot_bytes"], request["payload_offset"],
                            request["capacity"], request["offset"])


def _layout_fields(t):
    """The plan's layout of transfer `t`, as channel requests carry it."""
    return {"slots": t.slots, "slot_bytes": t.slot_bytes, "payload_offset": t.payload_offset,
            "capacity": t.capacity_bytes, "offset": t.offset}


class ChannelTable:
    """One task's regions, endpoints and bound channels (all closed with its Domain)."""

    def __init__(self, domain, config):
        self.domain = domain
        self.config = config
        self.endpoints = {}
        self.regions = {}
        self.channels = {}
        self.lock = threading.RLock()

    def handle(self, request):
        """Serves one of REQUESTS."""
        return getattr(self, request["op"])(request)

    def _endpoint(self, address):
        with self.lock:
            ep = self.endpoints.get(address)
            if ep is None or not ep.alive()[0]:
                ep = self.endpoints[address] = self.domain.connect(address, self.config.fabric,
                                                                   timeout=self.config.deadline_s)
            return ep

    def alloc_region(self, r):
        with self.lock:
            region = self.regions.get(r["region"])
            if region is None:
                job, index = split_task(r["sender"])
                region = self.domain.allocate(r["bytes"], label=r["region"], grant=[f"{job}:{index}"])
                self.regions[r["region"]] = region
        return {"address": self.domain.address, "descriptor": region.descriptor.hex()}

    def send_channel(self, r):
        ep = self._endpoint(r["receiver_address"])
        credit = self.domain.allocate(CREDIT_BYTES, label="credit")
        tx = _core.RingSender(ep, ep.attach(bytes.fromhex(r["ring"])), _layout(r), credit, epoch=0)
        tx.bind(r["key"])
        with self.lock:
            self.channels[r["key"]] = tx
        return {"address": self.domain.address, "credit": credit.descriptor.hex(),
                "fabric": ep.fabric}

    def recv_channel(self, r):
        ep = self._endpoint(r["sender_address"])
        rx = _core.RingReceiver(self.regions[r["region"]], _layout(r), ep,
                                ep.attach(bytes.fromhex(r["credit"])), epoch=0)
        rx.bind(r["key"])
        with self.lock:
            self.channels[r["key"]] = rx
        return {"fabric": ep.fabric}

    def close(self):
        """Unbinds every channel (the Domain's close frees regions and endpoints)."""
        with self.lock:
            for key in list(self.channels):
                _core.unbind_channel(key)
            self.channels.clear()


def open_channel(call, instance, t, region_bytes, allocated):
    """Sets up the channel of planned transfer `t` through the tasks' control services.

    Args:
        call: ``call(task, request) -> result`` (``Runtime.call``).
        instance: the instantiation id (prefix of region labels).
        t: a graph_pass Transfer decided "swap".
        region_bytes: bytes of the plan region `t` lives in.
        allocated: ``{region id: alloc result}`` shared by the instantiation's transfers; a
            region is allocated once, on its first transfer.
    Returns:
        The fabric the channel uses, and whether its region was allocated by this call.
    """
    label = f"{instance}/{t.region}"
    fresh = t.region not in allocated
    if fresh:
        allocated[t.region] = call(t.recv_task, {
            "op": "alloc_region", "region": label, "bytes": region_bytes, "sender": t.send_task})
    ring = allocated[t.region]
    sent = call(t.send_task, {
        "op": "send_channel", "key": t.channel_key, **_layout_fields(t),
        "receiver_address": ring["address"], "ring": ring["descriptor"]})
    call(t.recv_task, {
        "op": "recv_channel", "key": t.channel_key, "region": label, **_layout_fields(t),
        "sender_address": sent["address"], "credit": sent["credit"]})
    return sent["fabric"], fresh


def open_channels(call, instance, transfers, region_bytes):
    """Sets up the channels of an instantiation's swapped transfers.

    Args:
        call: ``call(task, request) -> result`` (``Runtime.call``).
        instance: the instantiation id (prefix of region labels).
        transfers: the graph_pass Transfers decided "swap".
        region_bytes: ``{region id: bytes}`` of the plan's regions.
    Returns:
        ``({channel key: fabric}, {recv task: bytes registered there})``.
    """
    fabrics, registered, allocated = {}, {}, {}
    for t in transfers:
        fabric, fresh = open_channel(call, instance, t, region_bytes[t.region], allocated)
        fabrics[t.channel_key] = fabric
        if fresh:
            registered[t.recv_task] = registered.get(t.recv_task, 0) + region_bytes[t.region]
    return fabrics, registered
