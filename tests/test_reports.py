"""Reports say what moved where, and what each receiving task registered for it."""
import dataclasses

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
    assert f"  registered on {W}: 2105344 B for 4096 B a step + tensors of run-time shape or in loops" in lines


def test_a_pair_in_a_loop_moves_its_bytes_each_iteration():
    """A step moves a loop's tensor once per iteration: the report says so, and counts the
    receiving task's bytes a step as known only at run time."""
    r = Report("1.2", swapped=[
        ("edge_1_w", f"{PS} -> {W}", "DT_FLOAT", 4096, "shm"),
        ("edge_5_x", f"{PS} -> {W}", "DT_FLOAT", 1024, "shm+zc"),
    ], kept=[], registered={W: 10240}, looped=["edge_5_x"])
    assert r.bytes_per_step() == ({W: 4096}, {W})
    lines = str(r).splitlines()
    assert f"  shm+zc   {PS} -> {W}  edge_5_x DT_FLOAT 1024 B each loop iteration" in lines
    assert f"  shm      {PS} -> {W}  edge_1_w DT_FLOAT 4096 B" in lines
    assert ("  1 swapped in while loops: their loops run one iteration at a time on each task that "
            "sends or receives them") in lines
    assert f"  registered on {W}: 10240 B for 4096 B a step + tensors of run-time shape or in loops" in lines


def test_a_task_that_registered_for_signals_only_moves_no_bytes():
    r = Report("1.1", swapped=[("edge_9_ctl", f"{W} -> {PS}", CONTROL, 0, "shm")], kept=[],
               registered={PS: 4096})
    lines = str(r).splitlines()
    assert f"  shm      {W} -> {PS}  edge_9_ctl control edge (orders execution, carries no data)" in lines
    assert f"  registered on {PS}: 4096 B for 0 B a step" in lines


def test_a_bundles_tensors_say_which_bundle_carries_them():
    r = Report("1.3", swapped=[("edge_1_a", f"{PS} -> {W}", "DT_FLOAT", 128, "shm"),
                               ("edge_2_b", f"{PS} -> {W}", "DT_INT32", 32, "shm"),
                               ("edge_3_c", f"{PS} -> {W}", "DT_FLOAT", 65536, "shm+zc")],
               kept=[], registered={W: 4096}, bundled={"edge_1_a": "d42aaa", "edge_2_b": "d42aaa"})
    lines = str(r).splitlines()
    assert f"  shm bundle d42aaa {PS} -> {W}  edge_2_b DT_INT32 32 B" in lines
    assert f"  shm+zc   {PS} -> {W}  edge_3_c DT_FLOAT 65536 B" in lines
    assert "  2 small tensors share 1 bundle(s): one write and one wait move each bundle" in lines
    assert Report.from_dict(dataclasses.asdict(r)).bundled == r.bundled
