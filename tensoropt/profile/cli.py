"""``tensoropt profile --devices cpu:2 --out data/profiles/NAME.json [--quick]``."""

from __future__ import annotations

import argparse
import sys


__all__ = ["main", "build_parser", "summary"]


def build_parser(prog: str = "tensoropt profile") -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description="Benchmark operators and collectives on the devices "
                                 "present and fit the cost model's parameters.")
    ap.add_argument("--devices", default="cpu:2", help="'cpu:N', 'cuda', 'cuda:N' or 'NxGPU' (default cpu:2)")
    ap.add_argument("--out", required=True, help="profile JSON to write (e.g. data/profiles/NAME.json); "
                    "written only when the run succeeds")
    ap.add_argument("--quick", action="store_true", help="small sweep (seconds), for tests")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    return ap


def format_time(s: float) -> str:
    """Seconds with a unit that keeps microseconds readable."""
    if s == 0:
        return "0"
    if abs(s) < 1e-3:
        return f"{s * 1e6:.1f} us"
    if abs(s) < 1.0:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def summary(prof) -> str:
    m = prof.machine
    where = ", ".join(x for x in (f"catalogue {m.catalogue_device}" if m.catalogue_device else "",
                                  f"{m.backend} over {m.link}" if m.link else "") if x)
    lines = [f"profile of {prof.devices} on {m.device_name}{f' [{where}]' if where else ''} ({m.threads_per_rank} "
             f"thread(s) per rank, torch {m.torch_version})"]
    lines.append("peak FLOP/s: " + ", ".join(f"{k} {v / 1e9:.1f} G" for k, v in prof.peak_flops_per_s.items())
                 + f"; copy bandwidth {prof.hbm_bytes_per_s / 1e9:.1f} GB/s")
    for fam, c in sorted(prof.curves.items()):
        lines.append(f"  {fam:12s} eff_max {c.eff_max:.3f}  flops_half {c.flops_half:.3g}  overhead "
                     f"{format_time(c.overhead_s)}  ({c.points} pts, median err {c.rel_error_median:.1%}, "
                     f"max {c.rel_error_max:.1%})")
    if prof.op_overhead_s or prof.update_s_per_param:
        lines.append(f"  framework time per operator (forward and backward) {format_time(prof.op_overhead_s)}; "
                     f"optimizer update {prof.update_s_per_param * 1e9:.2f} ns per parameter")
    for kind, c in sorted(prof.collectives.items()):
        per = "; ".join(f"p={g.group_size}: α {format_time(g.latency_s)}, B {g.bandwidth_bytes_per_s / 1e9:.2f} GB/s"
                        for g in c.per_group)
        lines.append(f"  {kind:14s} α {format_time(c.latency_s)}  B {c.bandwidth_bytes_per_s / 1e9:.2f} GB/s  "
                     f"(median err {c.rel_error_median:.1%}, max {c.rel_error_max:.1%}) [{per}]")
    for n in prof.notes:
        lines.append(f"  note: {n}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from .devices import DeviceNotPresentError
    from .run import ProfileError, profile
    args = build_parser().parse_args(argv)
    try:
        prof = profile(args.devices, out=args.out, quick=args.quick, progress=False if args.no_progress else None)
    except (DeviceNotPresentError, ProfileError, ValueError) as err:
        print(f"tensoropt profile: error: {err}", file=sys.stderr)
        return 2
    print(summary(prof))
    print(f"wrote {args.out}")
    return 0
