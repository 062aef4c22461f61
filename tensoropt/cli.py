"""Command line: ``tensoropt frontier ...`` and ``tensoropt profile ...``."""

from __future__ import annotations

import argparse
import sys

__all__ = ["main"]


def _frontier_parser(sub) -> None:
    p = sub.add_parser("frontier", help="the time/memory frontier of a zoo model on a device set",
                       description="Search every mesh and per-operator sharding of a model over a device "
                                   "set and print the Pareto frontier of (time per iteration, peak memory per device).")
    p.add_argument("--model", default="gpt2", help="zoo model name (default: gpt2); see --list-models")
    p.add_argument("--devices", default="8xA100-80GB",
                   help="'8xA100-80GB', '4x8xH100' (nodes x per node), or 'cpu:4' (default: 8xA100-80GB)")
    p.add_argument("--batch-size", type=int, default=None, help="global batch size (default: the model's)")
    p.add_argument("--precision", choices=("fp32", "bf16-mixed"), default=None,
                   help="default: bf16-mixed on GPUs, fp32 on CPU")
    p.add_argument("--optimizer", choices=("adam", "sgd", "sgd-momentum"), default="adam")
    p.add_argument("--budget", default=None, help="memory budget per device, e.g. 40GB or 30GiB: print the "
                                                  "fastest plan that fits")
    p.add_argument("--epsilon", type=float, default=0.0, help="(1+eps)-approximate frontier (default 0: exact)")
    p.add_argument("--epsilon-fallback", type=float, default=0.01,
                   help="the eps a mesh or pipeline shape is solved with again where its exact solve passes the "
                        "memory limit or half the time left (default 0.01; 0: none, such a search stops)")
    p.add_argument("--max-mesh-dims", type=int, default=3)
    p.add_argument("--recompute-policy", choices=("full", "op"), default="full",
                   help="what a recomputed block keeps: its input (full) or, as torchtitan's per-operator "
                        "policy, also its attention and every other linear's outputs (op)")
    p.add_argument("--profile", default=None, help="measured profile JSON (tensoropt profile)")
    p.add_argument("--calibration", default=None, help="whole-step calibration JSON (scripts/validate.py)")
    p.add_argument("--time-limit", type=float, default=None, help="seconds before the search gives up")
    p.add_argument("--memory-limit", default=None, help="resident memory the search may hold, e.g. 8GB "
                                                        "(default: 80%% of what is available)")
    p.add_argument("--workers", type=int, default=None, help="processes that solve meshes at once "
                                                            "(default: every CPU this process may use)")
    p.add_argument("--accumulate", type=int, nargs="*", default=(), metavar="M",
                   help="micro-batch counts of gradient accumulation (no pipeline stages) to search, e.g. 2 4")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table")
    p.add_argument("--plot", default=None, help="write the frontier plot to this PNG")
    p.add_argument("--out", default=None, help="write the chosen plan (--budget, else the fastest) as JSON")
    p.add_argument("--describe", action="store_true", help="print the chosen plan's per-operator table")
    p.add_argument("--list-models", action="store_true", help="list the zoo models and exit")
    p.add_argument("--rows", type=int, default=25, help="table rows shown, evenly spread over the frontier "
                                                        "(0: all)")
    p.add_argument("--no-progress", action="store_true")


def _run_frontier(args) -> int:
    from .models import MODEL_NAMES

    if args.list_models:
        print("\n".join(MODEL_NAMES))
        return 0
    if args.model not in MODEL_NAMES:
        print(f"error: unknown model {args.model!r}; known: {', '.join(MODEL_NAMES)}", file=sys.stderr)
        return 2
    from .search import frontier

    f = frontier(args.model, args.devices, batch_size=args.batch_size, precision=args.precision,
                 optimizer=args.optimizer, profile=args.profile, calibration=args.calibration,
                 epsilon=args.epsilon, epsilon_fallback=args.epsilon_fallback or None,
                 max_mesh_dims=args.max_mesh_dims, recompute_policy=args.recompute_policy,
                 accumulate=args.accumulate, time_limit_s=args.time_limit, memory_limit=args.memory_limit,
                 workers=args.workers,
                 progress=False if args.no_progress else None)
    df = f.to_pandas()
    if args.format == "csv":
        print(df.to_csv(index=False), end="")
    elif args.format == "json":
        print(df.to_json(orient="records", indent=1))
    else:
        print(repr(f))
        cols = ["time_ms", "memory_gib", "forward_end_gib", "mesh", "summary", "fits_device"]
        names = {"memory_gib": "peak_memory_gib"}      # the frontier's axis: the step's peak per device
        shown = df if args.rows <= 0 or len(df) <= args.rows else df.iloc[_spread(len(df), args.rows)]
        print(shown[cols].rename(columns=names).to_string(float_format=lambda x: f"{x:.4f}"))
        if len(shown) < len(df):
            print(f"({len(shown)} of {len(df)} plans shown, evenly spread; --rows 0 or --format csv for all)")
        if f.reference:
            print("\nreference plans:")
            print(f.references_to_pandas()[["label"] + cols].rename(columns=names)
                  .to_string(index=False, float_format=lambda x: f"{x:.4f}"))
        print(f"\nsearch: {f.stats['search_s']:.1f} s over meshes {', '.join(f.stats['meshes'])}; {f.caption()}")
        if f.stats.get("jobs"):
            print(f"jobs: {f.stats['jobs']} (meshes x ZeRO stages, pipeline shapes), {f.stats['skipped']} skipped: "
                  "their lower bounds were dominated by plans already found; "
                  f"{f.stats.get('workers', 1)} worker process(es)")
        searched = f.stats.get("peak_search") or {}
        if searched:
            print("peak searches: " + ", ".join(f"{n} {k}" for k, n in sorted(searched.items()))
                  + ("" if set(searched) <= {"exact"} else
                     " (block: plans of the block graph re-priced; forward-end: searched on end-of-forward "
                     "memory, then priced on the peak)"))
        for u in f.stats.get("unpriced_ops", []):
            print(f"not priced (no rule: kept replicated, per-element estimate): {u['operator']} "
                  f"{'+'.join(u['aten'])} {u['flops_fwd']:.3g} FLOPs forward, "
                  f"{(u['operand_bytes'] + u['output_bytes']) / 2**20:.1f} MiB in and out")
    plan = f.best(args.budget) if args.budget else f.min_time()
    if args.budget and args.format == "table":
        print(f"\nfastest plan within {args.budget}: {plan}")
    if args.describe:
        print(plan.describe())
    if args.out:
        plan.save(args.out)
    if args.plot:
        ax = f.plot(memory_budget=args.budget)
        ax.figure.savefig(args.plot, dpi=120, bbox_inches="tight")
        if args.format == "table":
            print(f"plot written to {args.plot}")
    return 0


def _spread(n: int, k: int) -> list[int]:
    """k indices spread evenly over range(n), first and last included."""
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)}) if k > 1 else [0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tensoropt", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _frontier_parser(sub)
    sub.add_parser("profile", help="measure operators and collectives on this machine (see "
                                   "'tensoropt profile --help')", add_help=False)
    args, rest = parser.parse_known_args(argv)
    if args.command == "profile":
        from .profile.cli import main as profile_main

        return profile_main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        return _run_frontier(args)
    except ValueError as err:               # bad device string, infeasible budget, capture errors
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (MemoryError, TimeoutError) as err:   # the search's own memory cap or time limit
        print(f"error: {err}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
