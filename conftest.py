"""Workspace-wide pytest set-up.

Under pytest-xdist every worker gets its share of the CPU cores for the numeric libraries (torch, OpenMP, BLAS):
otherwise N workers on N cores each start N threads, and the training tests of the baselines run several times
slower than alone. A value already set in the environment wins.
"""

from __future__ import annotations

import os

_workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
if _workers:
    # the cores this process may use (a container's or a job's share), not the host's count
    _cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    _share = str(max(1, _cores // int(_workers)))
    for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_name, _share)
