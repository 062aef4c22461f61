"""The engine's compiled kernels (``_kernels.c``), built on first use with the system C
compiler and loaded with ctypes.

The library is cached under ``$TENSOROPT_CACHE`` (default ``~/.cache/tensoropt``), named by
a hash of the source and the compiler command, and written atomically so that concurrent
processes never load a half-written file. Where no compiler is found, or
``TENSOROPT_NATIVE=0``, :func:`kernels` returns None and callers use their numpy code,
which computes the same results.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

__all__ = ["kernels", "native_enabled"]

_SOURCE = Path(__file__).with_name("_kernels.c")
_FLAGS = ["-O3", "-shared", "-fPIC", "-std=c99", "-D_GNU_SOURCE"]


def native_enabled() -> bool:
    return os.environ.get("TENSOROPT_NATIVE", "1") != "0"


def _cache_dir() -> Path:
    root = os.environ.get("TENSOROPT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "tensoropt")
    return Path(root)


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    return None


@lru_cache(maxsize=1)
def _load():
    cc = _compiler()
    if cc is None:
        return None
    source = _SOURCE.read_bytes()
    key = hashlib.sha256(source + " ".join([cc, *_FLAGS, sys.platform]).encode()).hexdigest()[:16]
    target = _cache_dir() / f"kernels-{key}.so"
    if not target.exists():
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
                out = Path(tmp) / "kernels.so"
                subprocess.run([cc, *_FLAGS, str(_SOURCE), "-o", str(out), "-lm"], check=True,
                               capture_output=True, timeout=120)
                os.replace(out, target)
        except (OSError, subprocess.SubprocessError):
            return None
    lib = ctypes.CDLL(str(target))
    i64, p = ctypes.c_int64, ctypes.c_void_p
    lib.kd_prune.argtypes = [i64, i64, ctypes.c_int, p, ctypes.c_int, p]
    lib.kd_prune.restype = ctypes.c_int
    c_int = ctypes.c_int
    lib.kd_combine.argtypes = [i64, i64, i64, i64, p, p, p, c_int, p, p, p, c_int, c_int, c_int, p, c_int,
                               ctypes.c_double, i64, p, p, p]
    lib.kd_combine.restype = ctypes.c_int
    lib.kd_fold.argtypes = [i64, i64, i64, i64, p, p, p, p, p, p, c_int, c_int, ctypes.c_double, i64, p, p, p]
    lib.kd_fold.restype = ctypes.c_int
    lib.pareto_sum2.argtypes = [i64, i64, i64, i64, p, p, p, p, i64, p, p, p, p]
    lib.pareto_sum2.restype = ctypes.c_int
    lib.min_sum_step.argtypes = [c_int, p, c_int, i64, c_int, p, p, p]
    lib.min_sum_step.restype = ctypes.c_int
    return lib


def kernels():
    """The loaded library, or None (no compiler, or turned off by ``TENSOROPT_NATIVE=0``)."""
    return _load() if native_enabled() else None
