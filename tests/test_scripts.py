"""The measuring scripts still run against the package as it is: a refactor that renames what
one of them times must fail here, not when the numbers are next needed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_profile_search_times_a_search_phase_by_phase(tmp_path):
    out = tmp_path / "profile.json"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "profile_search.py"), "--only",
                           "gpt-tiny:2xA100-80GB:1", "--batch-size", "8", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    row, = json.loads(out.read_text())["rows"]
    assert row["plans"] > 0 and row["jobs"] > 0
    # one process: every phase ran and the solves are part of the jobs' time
    for phase in ("capture_s", "build_problem_s", "lower_bound_s", "peak_model_s", "jobs_s"):
        assert row["phases_s"][phase] > 0, phase
    assert row["phases_s"]["jobs_s"] <= row["wall_s"]
    assert [s["step"] for s in row["timeline"]] == ["capture_model", "run_jobs", "reference_plans"]
