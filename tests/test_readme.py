"""The README's example runs as written: the planning snippet in a fresh interpreter, the
training loop (``scripts/train_example.py``) under torchrun on two CPU ranks."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tensoropt.launch import run_torchrun

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def test_planning_snippet_runs_as_written(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    snippet = blocks[0]
    assert "tensoropt.frontier(model" in snippet and "plan.save(" in snippet
    r = subprocess.run([sys.executable, "-c", snippet], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "plan.json").exists() and (tmp_path / "frontier.png").exists()
    assert "memory_gib" in r.stdout and "peak per device" in r.stdout   # the table and the plan: peaks


def test_training_loop_runs_under_torchrun():
    second = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)[1]
    script = (ROOT / "scripts" / "train_example.py").read_text()
    for line in ("tensoropt.parallelize(model", "tensoropt.train_step(model, **batch)"):
        assert line in second and line in script
    r = run_torchrun(ROOT / "scripts" / "train_example.py", ["--steps", "3"], nproc=2, timeout=300)
    assert r.ok, r.summary()
    losses = [float(m) for m in re.findall(r"step \d+ loss ([0-9.]+)", r.stdout)]
    assert len(losses) == 3 and losses[-1] < losses[0], r.stdout
