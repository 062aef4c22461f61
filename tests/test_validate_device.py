"""scripts/validate_device.py's runner plumbing, on the CPU (the GPU runs it for real)."""

import json
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
SCRIPT = os.path.join(ROOT, "scripts", "validate_device.py")


def test_isolated_run_merges_one_row_per_plan_and_fails_loudly(tmp_path):
    # no plans under --dir: every child process records its failure, the parent merges them and exits non-zero
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, SCRIPT, "run", "--isolate", "--device", "cpu", "--cases", "resnet50",
                           "--dir", str(tmp_path / "noplans"), "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    measured = json.loads((out / "measured.json").read_text())
    assert measured["machine"]["isolated"] is True
    assert [(r["case"], r["policy"], r["ok"]) for r in measured["rows"]] == [
        ("resnet50", "none", False), ("resnet50", "full", False)]
    assert all("resnet50_" in r["error"] for r in measured["rows"])


def test_policies_filter_runs_only_the_named_policy(tmp_path):
    out = tmp_path / "out"
    subprocess.run([sys.executable, SCRIPT, "run", "--device", "cpu", "--cases", "resnet50", "--policies", "full",
                    "--dir", str(tmp_path / "noplans"), "--out", str(out)], capture_output=True, timeout=300)
    rows = json.loads((out / "measured.json").read_text())["rows"]
    assert [(r["case"], r["policy"]) for r in rows] == [("resnet50", "full")]
