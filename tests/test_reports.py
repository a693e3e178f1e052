"""Reports say what moved where, and what each receiving task registered for it."""
from rdmadev.cluster.reports import CONTROL, Report

PS, W = "/job:ps/replica:0/task:0", "/job:worker/replica:0/task:0"


def test_registered_bytes_stand_next_to_the_bytes_a_step_moves():
    r = Report("1.0", swapped=[
        ("edge_1_w", f"{PS} -> {W}", "DT_FLOAT", 4096, "shm"),
        ("edge_2_g", f"{W} -> {PS}", "DT_FLOAT", 4096, "shm+zc"),
        ("edge_3_b", f"{W} -> {PS}", "DT_FLOAT", 1024, "shm"),
        ("edge_4_ids", f"{PS} -> {W}", "DT_INT64", None, "tcp"),
    ], kept=[], registered={PS: 12288, W: 2105344})
    assert r.bytes_per_step() == ({W: 4096, PS: 5120}, {W})
    lines = str(r).splitlines()
    assert f"  registered on {PS}: 12288 B for 5120 B a step (2.40x)" in lines
    assert f"  registered on {W}: 2105344 B for 4096 B a step + tensors of run-time shape" in lines


def test_a_task_that_registered_for_signals_only_moves_no_bytes():
    r = Report("1.1", swapped=[("edge_9_ctl", f"{W} -> {PS}", CONTROL, 0, "shm")], kept=[],
               registered={PS: 4096})
    lines = str(r).splitlines()
    assert f"  shm      {W} -> {PS}  edge_9_ctl control edge (orders execution, carries no data)" in lines
    assert f"  registered on {PS}: 4096 B for 0 B a step" in lines
