"""What a frontier search is asked to do (:class:`SearchOptions`) and how long it may take
(:class:`Deadline`)."""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass

from .engine import SolveTimeout, memguard
from .engine.memguard import SearchCrowdedOut, SearchMemoryExceeded
from .units import parse_bytes

__all__ = ["SearchOptions", "Deadline", "MEMORY_FRACTION", "MEMORY_ADVICE"]

# the share of the machine's available memory a search may take by default
MEMORY_FRACTION = 0.8
MEMORY_ADVICE = ("Search fewer meshes (max_mesh_dims), pass epsilon > 0 or coarse=True, "
                 "or raise memory_limit if the machine has room.")


@dataclass(frozen=True)
class SearchOptions:
    """The keywords of :func:`tensoropt.frontier` that shape the search."""
    #: "bf16-mixed" or "fp32"; None: fp32 on CPU ranks, bf16-mixed on GPUs
    precision: str | None = None
    #: "adam", "sgd" or "sgd-momentum": the optimizer state each parameter carries
    optimizer: str = "adam"
    #: path of a measured profile (``tensoropt profile``) that prices compute and collectives
    profile: str | None = None
    #: path of fitted cost terms (``cost_terms.CostTerms``) that price every node and edge
    calibration: str | None = None
    #: > 0: a (1+ε)-approximate frontier per mesh (``engine.solve``)
    epsilon: float = 0.0
    #: the ε a job is solved with again where its exact solve passes the memory cap or half the
    #: time left (``fallback.solve_job``); ``Frontier.stats["approximated"]`` lists those
    #: jobs. None: such a job ends the search with its error
    epsilon_fallback: float | None = 0.01
    #: meshes of at most this many axes
    max_mesh_dims: int = 3
    #: search the coarse space of ``tensoropt.space``; None: above 64 devices
    coarse: bool | None = None
    #: also search ZeRO stages 2 and 3 on the data-parallel axes
    zero: bool = True
    #: activation recomputation per repeated block as a searched choice
    recompute: bool = True
    #: what a recomputed block keeps (``tensoropt.recompute.POLICIES``): "full" keeps its
    #: input; "op" also the outputs of its attention kernels and every other linear's
    recompute_policy: str = "full"
    #: also search pipeline stages over the repeated blocks (``tensoropt.pipeline``)
    pipeline: bool = True
    #: micro-batch counts of gradient accumulation without pipeline stages to search on every
    #: mesh and ZeRO stage (``tensoropt.accumulation``); counts that do not divide the batch are
    #: left out
    accumulate: tuple[int, ...] = ()
    #: seconds for the whole search (every mesh, stage count and device count); None: no limit
    time_limit_s: float | None = None
    #: a progress bar; None: when stderr is a terminal
    progress: bool | None = None
    #: price the reference plans (data parallel, Megatron) too
    references: bool = True
    #: the most resident memory the search may hold ("8GB", bytes); None: ``MEMORY_FRACTION``
    #: of what the machine had available when the search began
    memory_limit: float | str | None = None
    #: skip meshes and pipeline shapes whose lower bound the frontier found so far dominates
    #: (``search_jobs``); the frontier is the same either way
    prune_meshes: bool = True
    #: processes that build and solve meshes and pipeline shapes at once (``search_pool``;
    #: forked, so on Linux only); None: every CPU this process may use. The frontier is the same
    workers: int | None = None

    def worker_count(self) -> int:
        from .search_pool import usable_cpus

        if self.workers is not None and self.workers < 1:
            raise ValueError(f"workers must be at least 1, got {self.workers}")
        if self.workers is not None:
            return self.workers
        return 1 if in_distributed_run() else usable_cpus()

    def fallback(self) -> float | None:
        """The fallback ε the jobs get (None where it would not loosen the search's own)."""
        f = self.epsilon_fallback
        if f is not None and not (f > 0 and f < float("inf")):
            raise ValueError(f"epsilon_fallback must be a finite number > 0 or None, got {f!r}")
        return f if f is not None and f > self.epsilon else None

    def memory_cap_bytes(self) -> float | None:
        """The cap :func:`engine.memguard.memory_cap` enforces (None where it cannot be read)."""
        if self.memory_limit is not None:
            return float(parse_bytes(self.memory_limit))
        avail, held = memguard.available_bytes(), memguard.resident_bytes()
        if avail is None or held is None:
            return None
        return held + MEMORY_FRACTION * avail


class Deadline:
    """A search's time limit, shared by every solve in it."""

    def __init__(self, time_limit_s: float | None, what: str, start: float | None = None):
        self.time_limit_s = time_limit_s
        self.what = what                         # e.g. "gpt2 on 8xA100-80GB"
        self.start = time.monotonic() if start is None else start

    def elapsed_s(self) -> float:
        return time.monotonic() - self.start

    def remaining_s(self) -> float | None:
        """What a solve starting now may take (None: no limit)."""
        if self.time_limit_s is None:
            return None
        return max(self.time_limit_s - self.elapsed_s(), 1e-3)

    @contextmanager
    def solving(self, what: str):
        """A solve's timeout restated for the whole search (its own limit is what was left)."""
        try:
            yield
        except SolveTimeout as err:
            raise SolveTimeout(
                f"the frontier search of {self.what} stopped after {self.elapsed_s():.1f} s "
                f"of time_limit_s={self.time_limit_s}, while solving {what} "
                f"(at {str(err).split(' at ', 1)[-1].split('. ')[0]})."
                " Raise time_limit_s, pass epsilon > 0, "
                "search fewer meshes (max_mesh_dims) or the coarse space (coarse=True).") from None
        except SearchCrowdedOut:
            raise
        except SearchMemoryExceeded as err:
            raise SearchMemoryExceeded(f"while solving {what}, {err}") from None


def in_distributed_run() -> bool:
    """Whether this process is a rank of an initialized ``torch.distributed`` group (a search
    run under torchrun): a forked worker would copy it without its communication threads,
    so the search stays in one process unless ``workers`` says otherwise."""
    dist = sys.modules.get("torch.distributed")
    return bool(dist is not None and dist.is_available() and dist.is_initialized())
