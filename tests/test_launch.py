"""tensoropt.launch: torchrun launches that cannot hang the caller."""

from __future__ import annotations

import os
import re
from pathlib import Path

from tensoropt.launch import run_torchrun

SCRIPTS = Path(__file__).parent / "dist_scripts"


def test_run_torchrun_kills_hanging_workers():
    r = run_torchrun(SCRIPTS / "hang.py", nproc=2, timeout=12)
    assert r.timed_out and not r.ok
    pids = [int(p) for p in re.findall(r"PID (\d+)", r.stdout)]     # two ranks' lines may interleave
    assert pids
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or _is_zombie(pid), f"worker {pid} survived"


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
