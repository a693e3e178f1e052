"""rdmadev.tf.profile's arithmetic on known events: matching receives with their sends across
tasks, notice times, per-step sums and busy time. The events themselves are read from a real
TF profiler trace in tests/e2e (test_every_swapped_transfer_is_on_tfs_profiler_timeline)."""
from rdmadev.tf.profile import Transfer, matched, notice_ns, summarize, table

US = 1000


def t(task, kind, channel, start_us, dur_us, nbytes=4, **phases):
    return Transfer(task, kind, channel, "", nbytes, 1, start_us * US, dur_us * US,
                    {k: v * US for k, v in phases.items()})


def test_receives_match_the_send_that_carried_their_data():
    ev = [
        t("w", "recv", "c", 0, 50),      # 0: first receive in the trace: no bound, left out
        t("p", "send", "c", 40, 5),      # 1: its send
        t("w", "recv", "c", 100, 120),   # 2: waits; data at 200, done at 220
        t("p", "send", "c", 190, 10),    # 3
        t("p", "send", "c", 300, 10),    # 4: data there at 310 before the receive starts
        t("w", "recv", "c", 400, 30),    # 5
        t("w", "recv", "c", 500, 40),    # 6: its send is not in the trace (ended after it)
        t("p", "send", "c", 600, 5),     # 7
        t("w", "recv", "other", 100, 10),  # 8: a channel with no send in the trace
    ]
    assert matched(ev) == {2: 3, 5: 4}
    assert notice_ns(ev) == {2: 20 * US, 5: 30 * US}


def test_summary_is_per_step_per_channel_and_busy_is_wall_time():
    ev = [t("w", "recv", "a", 0, 100, nbytes=8, wait_data=90, copy=10),
          t("w", "recv", "a", 1000, 100, nbytes=8, wait_data=90, copy=10),
          t("w", "recv", "b", 50, 100, nbytes=4, wait_data=100),   # overlaps a's first
          t("p", "send", "a", 80, 5, nbytes=8, write=5),
          t("p", "send", "a", 1080, 5, nbytes=8, write=5)]
    rows = {(r["task"], r["kind"]): r for r in summarize(ev, {"w": "worker:0", "p": "ps:0"})}
    w = rows[("worker:0", "recv")]
    assert w["channels"] == 2 and w["steps"] == 2  # executions: a 2, b 1; median 1.5 rounds to 2
    assert w["bytes"] == 8 + 4  # per step: each channel's mean per execution, summed
    assert w["kernel_ms"] == 0.2 and w["copy_ms"] == 0.01 and w["wait_data_ms"] == 0.19
    assert w["busy_ms"] == (150 + 100) / 1000 / 2  # [0,150] and [1000,1100] over 2 steps
    assert w["notice_us"] == 15.0  # a's second receive: send ended at 1085, receive at 1100
    assert rows[("ps:0", "send")]["notice_us"] is None
    text = table(summarize(ev))
    assert "notice us" in text and text.count("\n") == 4
