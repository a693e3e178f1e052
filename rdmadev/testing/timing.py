"""Timing of tf.function variants in one run, for the benchmarks' same-run baselines; polling
for a condition with a bound, for tests."""

import time

__all__ = ["ms_per_call", "planned_with", "wait_until"]


def ms_per_call(variants, rounds, calls, on_round=None):
    """Milliseconds per call of each variant, one figure per round.

    Each variant is called twice first (trace, instantiate, set up channels), then every
    round calls each variant `calls` times in turn, so a noisy moment of the machine falls on
    all of them alike.

    Args:
        variants: ``{key: callable}`` taking no arguments.
        rounds: rounds of alternation.
        calls: calls per variant per round.
        on_round: called with the round's number (from 1) after each round, e.g. for progress.

    Returns:
        ``{key: [ms per call in round 1, ...]}``.
    """
    for fn in variants.values():
        fn()
        fn()
    ms = {key: [] for key in variants}
    for r in range(rounds):
        for key, fn in variants.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            ms[key].append((time.perf_counter() - t0) / calls * 1e3)
        if on_round is not None:
            on_round(r + 1)
    return ms


def planned_with(fn, **settings):
    """`fn` (an rdmadev.optimize'd function taking no arguments) called once, so traced,
    partitioned and planned, with this process's rdmadev settings (its runtime's, started by
    the first call of an optimized function) changed by `settings`
    (rdmadev.Config fields, e.g. ``bundle_below_bytes=0``) for that call only: a variant whose
    channels keep the plan those settings gave, to time against one planned as configured.

    Returns:
        `fn`.
    """
    import dataclasses

    from ..cluster import runtime
    from ..errors import ConfigError
    rt = runtime.current()
    if rt is None:
        raise ConfigError("planned_with needs this process's rdmadev runtime",
                          hint="call an rdmadev.optimize'd function once first: its first call starts it")
    before = rt.config
    rt.config = dataclasses.replace(before, **settings)
    try:
        fn()
    finally:
        rt.config = before
    return fn


def wait_until(predicate, within, every=0.05):
    """Calls `predicate` every `every` seconds until it holds or `within` seconds passed (a
    hang guard, not a timing check); returns its last answer."""
    deadline = time.monotonic() + within
    while not predicate() and time.monotonic() < deadline:
        time.sleep(every)
    return predicate()
