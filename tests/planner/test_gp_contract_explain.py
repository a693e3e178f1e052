"""The plan contract (JSON, version), explain (table, picture) and the CLI."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import gp_builders as B
import graph_pass as gp
from graph_pass import _proto
from rdmadev._core import PLANNER_RULES as RULES
from rdmadev.tools import plan as cli

ROOT = Path(__file__).resolve().parents[2]


def sample_plan():
    ps, (w0, w1) = B.ps_worker_step(workers=2)
    return gp.plan_partitions(B.partitions(ps, w0, w1), instance_id="inst", rules=RULES)


def test_json_roundtrip_is_exact_and_carries_the_layout():
    plan = sample_plan()
    text = plan.to_json(indent=1)
    data = json.loads(text)
    assert data["schema"] == "rdmadev.plan" and data["version"] == gp.PLAN_VERSION == 4
    assert data["layout"] == RULES.layout.to_dict()
    assert set(data) == {"schema", "version", "layout", "config", "instance_id", "transfers", "regions", "tasks"}
    t = data["transfers"][0]
    for key in ("channel_id", "channel_key", "tensor_name", "send_device", "recv_device", "send_device_incarnation",
                "send_node", "recv_node", "dtype", "shape", "bytes", "decision", "reason", "region", "offset",
                "task_offset", "slots", "slot_bytes", "payload_offset", "capacity_bytes", "rank_capacity", "kind"):
        assert key in t
    again = gp.Plan.from_json(text)
    assert again.to_json(indent=1) == text and again == plan


def test_from_json_rejects_other_schemas_and_versions():
    data = sample_plan().to_dict()
    with pytest.raises(gp.PlanFormatError, match="version 5 is not supported"):
        gp.Plan.from_dict(dict(data, version=5))
    with pytest.raises(gp.PlanFormatError, match="not an rdmadev.plan document"):
        gp.Plan.from_dict(dict(data, schema="other"))
    with pytest.raises(gp.PlanFormatError, match="not valid JSON"):
        gp.Plan.from_json("{")
    bad = dict(data, transfers=[{"tensor_name": "x"}])
    with pytest.raises(gp.PlanFormatError, match="a transfer is missing"):
        gp.Plan.from_dict(bad)


def test_explain_table_lists_every_transfer_with_decision_and_region(tmp_path):
    plan = sample_plan()
    text = gp.explain(plan)
    lines = text.splitlines()
    assert lines[0].split() == ["transfer", "from", "->", "to", "kind", "dtype", "shape", "bytes", "decision",
                                "reason", "region", "offset"]
    rows = [line for line in lines if "/_send" in line]
    assert len(rows) == len(plan.transfers) == 4
    assert any("ps:0 -> worker:1" in r and "[4,8]" in r and "128" in r and "swap" in r and "worker:1<-ps:0" in r
               for r in rows)
    assert "4 cross-task transfers: 4 swapped (512 B per step), 0 kept on gRPC" in text
    assert "ps:0 registers 8.0 KiB (8192 B) in 2 region(s)" in text
    assert "config: 1 slot per static channel, 2 per dynamic one," in text


def test_explain_draws_png_and_svg(tmp_path):
    plan = sample_plan()
    png, svg = tmp_path / "plan.png", tmp_path / "plan.svg"
    gp.explain(plan, png)
    gp.explain(plan, str(svg), title="t")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    text = svg.read_text()
    assert text.lstrip().startswith("<?xml") and "<svg" in text


def test_picture_has_task_boxes_and_highlighted_swaps_and_marked_keeps():
    from matplotlib.colors import to_hex
    from matplotlib.patches import FancyArrowPatch

    from graph_pass.explain import KEEP_COLOR, SWAP_COLOR, build_figure

    ps, (w,) = B.ps_worker_step()
    client = B.Partition("/job:localhost/replica:0/task:0/device:CPU:0")
    client.node("arg", "_Arg", T=("type", B.FLOAT), _output_shapes=("shapes", [(3,)]), index=0)
    B.pair(client, w, "edge_91_arg", "arg")
    plan = gp.plan_partitions(B.partitions(ps, w, client), instance_id="i", rules=RULES)
    (ax,) = build_figure(plan).axes
    boxes = [t.get_text() for t in ax.texts if "registers" in t.get_text()]
    assert sorted(b.split()[0] for b in boxes) == ["localhost:0", "ps:0", "worker:0"]
    assert "ps:0\nregisters 4.0 KiB" in boxes
    arrows = [p for p in ax.patches if isinstance(p, FancyArrowPatch)]
    styles = sorted((to_hex(a.get_edgecolor()), a.get_linestyle()) for a in arrows)
    assert styles == sorted([(SWAP_COLOR, "-"), (SWAP_COLOR, "-"), (KEEP_COLOR, "--")])
    labels = [t.get_text() for t in ax.texts]
    assert "kept on gRPC:\n1 client_task" in labels and "1 swapped\n128 B/step" in labels


def _metadata_file(tmp_path):
    ps, (w,) = B.ps_worker_step()
    md = _proto.RunMetadata()
    md.function_graphs.add().partition_graphs.extend([ps.gd, w.gd])
    eager = md.function_graphs.add()  # an eager op: one partition, nothing to plan
    eager.partition_graphs.add().node.add(name="c", op="Const", device=B.dev("worker"))
    path = tmp_path / "step.runmeta"
    path.write_bytes(md.SerializeToString())
    return path


def test_cli_plans_a_saved_run_metadata(tmp_path, capsys):
    out_json, pic = tmp_path / "plan.json", tmp_path / "plan.png"
    rc = cli.main(["--run-metadata", str(_metadata_file(tmp_path)), "--json", str(out_json), "--out", str(pic),
                   "--slots", "3"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "2 cross-task transfers: 2 swapped" in text and "config: 3 slots," in text
    (plan,) = [gp.Plan.from_dict(d) for d in json.loads(out_json.read_text())]
    assert plan.config.slots == 3 and plan.instance_id == "plan" and pic.exists()
    gp.validate(plan)


def test_cli_plans_graphdef_files_as_halves(tmp_path, capsys):
    ps, (w,) = B.ps_worker_step()
    f = tmp_path / "ps.pb"
    f.write_bytes(ps.gd.SerializeToString())
    assert cli.main(["--graphdef", str(f)]) == 0
    assert "not_carried_half_pair" in capsys.readouterr().out
    assert cli.main(["--graphdef", str(f), "--carry", "half_pairs"]) == 0
    out = capsys.readouterr().out
    assert "half_pair " in out and "ops carry static shapes + half_pairs" in out


def test_cli_errors(tmp_path, capsys):
    bad = tmp_path / "bad.pb"
    bad.write_bytes(b"\xff\xff\xff")
    assert cli.main(["--graphdef", str(bad)]) == 1
    assert "not a serialized GraphDef" in capsys.readouterr().err
    assert cli.main(["--run-metadata", str(tmp_path / "missing")]) == 1
    with pytest.raises(SystemExit) as exc:
        cli.main([])
    assert exc.value.code == 2
    assert cli.main(["not-a-target"]) == 2
    assert "must be FILE.py:FUNC" in capsys.readouterr().err
    assert cli.main([str(tmp_path / "nope.py") + ":run"]) == 2
    assert "no such file" in capsys.readouterr().err


def test_python_dash_m_rdmadev_tools_plan_runs_the_cli(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "rdmadev.tools.plan", "--run-metadata",
                           str(_metadata_file(tmp_path))], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "2 swapped" in proc.stdout
