"""One torchrun launch of a case worker (tests/dist_scripts), results keyed by case."""

from __future__ import annotations

from tensoropt.launch import run_torchrun


def launch_cases(worker, nproc: int, cases: list[str], measure: list[str], timeout: float) -> dict[str, dict]:
    """Run ``worker --case ... --measure ...`` on ``nproc`` ranks; every case must report."""
    r = run_torchrun(worker, ["--case", ",".join(cases), "--measure", ",".join(measure)],
                     nproc=nproc, timeout=timeout)
    assert r.ok, r.summary()
    out = {res["case"]: res for res in r.results}
    assert set(out) == set(cases), r.summary()
    return out
