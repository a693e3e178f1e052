"""rdmadev's native bindings, one extension module per object family (pyverbs style).

Built by setup.py from ``_native/python/rdmadev/_native/*.pyx``; the raw ``cdef extern``
declarations of the C++ core are the ``c_*.pxd`` files next to them.

==========  ==============================================================================
domain      Domain; fabric_priority, unviable_reason, recent_events, error_kinds, ANY_PEER
region      Region
endpoint    Endpoint, RemoteRegion
channel     RingLayout, RingSender, RingReceiver, CREDIT_BYTES, wire_layout, channel table
crypto      hmac_sha256 (libcrypto), the handshake (client_handshake, server_handshake)
bench       benchmark loops in C++
==========  ==============================================================================

Use them through ``rdmadev._core``, which re-exports what the rest of rdmadev uses.
"""
