"""The package layout by role: rdmadev.cluster never imports TensorFlow or the TF layer, and
no rdmadev module imports in a circle (checked on the import graph, and by importing every
module first in a fresh interpreter)."""
import ast
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "rdmadev"


def _modules(extensions=False):
    """{module name: path} of every rdmadev .py file (and compiled extension, a leaf)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    if extensions:
        for path in sorted(PACKAGE.rglob("*.so")):
            parts = path.relative_to(ROOT).parts
            out[".".join(parts[:-1] + (path.name.split(".")[0],))] = path
    return out


def _import_graph():
    """Edges module -> rdmadev module it imports (anywhere in the file, lazy imports too)."""
    modules = _modules(extensions=True)
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in _modules().items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")
                base = base[:len(base) - node.level + 1] if node.level else []
                base = ".".join(base + ([node.module] if node.module else []))
                # `from pkg import name`: the submodule pkg.name when there is one, else pkg
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            graph.add_edges_from((name, t) for t in targets if t in modules and t != name)
    return graph


def test_no_import_circle():
    graph = _import_graph()
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, f"rdmadev modules import in a circle: {cycles}"


@pytest.mark.parametrize("layer, forbidden", [
    ("rdmadev.cluster", ("rdmadev.tf", "rdmadev.tools", "rdmadev.testing")),
    ("rdmadev.testing", ("rdmadev.tf", "rdmadev.tools")),
])
def test_layers_import_downwards_only(layer, forbidden):
    graph = _import_graph()
    for module in [m for m in graph if m == layer or m.startswith(layer + ".")]:
        reached = nx.descendants(graph, module) - {"rdmadev"}
        bad = sorted(m for m in reached if m.startswith(forbidden))
        assert not bad, f"{module} imports {bad}; {layer} must not depend on {forbidden}"


def test_cluster_layer_does_not_import_tensorflow():
    code = ("import sys, rdmadev.cluster, rdmadev.cluster.runtime, rdmadev.cluster.channels; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_every_module_imports_first_in_a_fresh_interpreter():
    """A circle shows as an ImportError only for some entry points: try each one first."""
    names = [m for m in _modules() if not m.endswith("__main__")]
    procs = {m: subprocess.Popen([sys.executable, "-c", f"import {m}"], cwd=ROOT, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True) for m in names}
    failed = {m: p.communicate(timeout=300)[0][-1500:] for m, p in procs.items()}
    failed = {m: out for m, out in failed.items() if procs[m].returncode}
    assert not failed, failed
