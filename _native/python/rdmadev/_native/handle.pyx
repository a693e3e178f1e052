# cython: language_level=3
"""The base of every native object: one lifetime scheme for all of them."""

__all__ = ["Handle"]


cdef class Handle:
    """A context manager whose exit calls close(). Subclasses define close() (idempotent)
    and `closed`; they are weakly referenceable, so that parents can track them weakly."""

    def close(self):
        # Abstract: every subclass (Domain, Region, Endpoint, ...) defines its own close().
        raise NotImplementedError(f"{type(self).__name__} does not define close()")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
