"""Launch helpers: run a script under ``torchrun`` as a subprocess with a hard timeout.

Used by the multi-process tests. The child runs in its own process group (session), so on
timeout the whole tree (torchrun agent and every worker rank) is killed and nothing hangs.
Workers report results by printing lines ``RESULT <json>``; :func:`run_torchrun` collects them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

RESULT_PREFIX = "RESULT "


@dataclass
class TorchrunResult:
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool
    results: list[dict] = field(default_factory=list)   # parsed ``RESULT <json>`` lines

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def summary(self, tail: int = 4000) -> str:
        return (f"returncode={self.returncode} timed_out={self.timed_out}\n"
                f"--- stdout (tail) ---\n{self.stdout[-tail:]}\n"
                f"--- stderr (tail) ---\n{self.stderr[-tail:]}")


def torchrun_executable() -> list[str]:
    """The torchrun next to the running interpreter (the venv's), else ``python -m torch.distributed.run``."""
    cand = Path(sys.executable).with_name("torchrun")
    if cand.exists():
        return [str(cand)]
    found = shutil.which("torchrun")
    if found:
        return [found]
    return [sys.executable, "-m", "torch.distributed.run"]


def emit_result(obj: dict) -> None:
    """Called from a worker: print one JSON result line that :func:`run_torchrun` will collect."""
    print(RESULT_PREFIX + json.dumps(obj, default=str), flush=True)


def run_each(items, run, describe) -> None:
    """Called from a worker on every rank of an initialised process group: ``run(item)`` for
    each item, a result dict that gains ``ok``; a failure becomes ``describe(item)`` with the
    error, whether it is a :class:`~tensoropt.apply.PlanNotApplicable`, and its trace. Rank 0
    prints every result for :func:`run_torchrun` (other ranks print only their failures);
    the ranks keep in step with a barrier per item, and the process group is destroyed at
    the end."""
    import traceback

    import torch.distributed as dist

    for item in items:
        try:
            res = run(item)
            res["ok"] = True
        except Exception as e:  # noqa: BLE001 - reported to the launcher
            from .apply import PlanNotApplicable

            res = {**describe(item), "ok": False, "error": f"{type(e).__name__}: {e}",
                   "not_applicable": isinstance(e, PlanNotApplicable), "trace": traceback.format_exc()[-3000:]}
        if dist.get_rank() == 0:
            emit_result(res)
        elif not res["ok"]:
            print(f"rank {dist.get_rank()} {describe(item)}: {res['trace']}", file=sys.stderr, flush=True)
        dist.barrier()
    dist.destroy_process_group()


def finish_worker(code: int = 0) -> None:
    """End a worker whose results are printed and whose process group is gone, without
    interpreter teardown, where gloo's threads can abort the process ("terminate called
    without an active exception") and turn a finished run into a failed launch."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_torchrun(script: str | os.PathLike, args: list[str] | tuple[str, ...] = (), *, nproc: int = 2,
                 timeout: float = 120.0, env: dict[str, str] | None = None,
                 cwd: str | os.PathLike | None = None) -> TorchrunResult:
    """Run ``torchrun --standalone --nproc-per-node nproc script args...`` with a hard timeout.

    ``OMP_NUM_THREADS=1`` is set (the tests run on small CPU machines). On timeout, the whole
    process group of the child is sent SIGTERM then SIGKILL. Never raises on worker failure:
    inspect ``.ok`` / ``.summary()``.
    """
    cmd = [*torchrun_executable(), "--standalone", f"--nproc-per-node={nproc}",
           "--max-restarts=0", str(script), *map(str, args)]
    full_env = dict(os.environ)
    # A parent torchrun environment must not leak into the child's rendezvous.
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
              "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RUN_ID"):
        full_env.pop(k, None)
    full_env["OMP_NUM_THREADS"] = "1"
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    repo_root = str(Path(__file__).resolve().parent.parent)
    full_env["PYTHONPATH"] = repo_root + (os.pathsep + full_env["PYTHONPATH"] if full_env.get("PYTHONPATH") else "")
    if env:
        full_env.update(env)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=full_env, cwd=cwd, start_new_session=True)
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc)
        out, err = proc.communicate()
    results = []
    for line in out.splitlines():
        if line.startswith(RESULT_PREFIX):
            try:
                results.append(json.loads(line[len(RESULT_PREFIX):]))
            except json.JSONDecodeError:
                pass
    return TorchrunResult(proc.returncode if not timed_out else -9, out, err, timed_out, results)


def run_cases(script: str | os.PathLike, cases: list[str], args: list[str] | tuple[str, ...] = (), *,
              nproc: int = 2, timeout: float = 120.0, launches: int | None = None) -> dict[str, dict]:
    """Every case's result from ``script args --case c1,c2,...`` (a :func:`run_each` worker
    printing a result with ``"case"`` per case). A failing case can leave the ranks out of
    step and end the launch: the case it ended in is reported failed with the launch's
    summary, and the cases after it run in a new launch (at most ``launches`` in all)."""
    out: dict[str, dict] = {}
    for _ in range(launches or len(cases) + 1):
        left = [c for c in cases if c not in out]
        if not left:
            break
        r = run_torchrun(script, [*args, "--case", ",".join(left)], nproc=nproc, timeout=timeout)
        out.update({res["case"]: res for res in r.results})
        crashed = next((c for c in left if c not in out), None)
        if crashed is not None and not r.ok:
            out[crashed] = {"case": crashed, "world": nproc, "ok": False,
                            "error": "the launch ended in this case", "trace": r.summary()[-3000:]}
    return out


def _descendants(pid: int) -> list[int]:
    """All descendant pids of ``pid`` (Linux /proc walk; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for e in entries:
        if not e.isdigit():
            continue
        try:
            with open(f"/proc/{e}/stat") as f:
                stat = f.read()
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(e))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill torchrun and its workers. torchrun starts each worker in a new session, so the
    workers are collected by pid first and killed individually if torchrun does not take them down."""
    kids = _descendants(proc.pid)
    try:
        os.killpg(os.getpgid(proc.pid), signal.SIGTERM)   # torchrun forwards SIGTERM to its workers
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    for pid in [proc.pid, *kids]:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
