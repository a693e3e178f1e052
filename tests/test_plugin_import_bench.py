"""benchmarks/plugin_import.py runs end to end: the plugin's load is timed in a process that
imported TF with it switched off, and loads the protocol library. Never checks timing."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Three TF imports of 3-6 s each, with headroom for a loaded machine.
TIMEOUT_S = 240

pytestmark = pytest.mark.slow


def test_plugin_import_one_round():
    p = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "plugin_import.py"),
                        "--rounds", "1"], capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    for name in ("plugin load", "import tensorflow, plugin on", "import tensorflow, plugin off"):
        assert re.search(rf"^  {name} +median +\d+\.\d+ ms", p.stdout, re.M), p.stdout
