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
    # nnU-Net's worker processes too (they follow the affinity, which xdist workers share)
    for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "nnUNet_def_n_proc"):
        os.environ.setdefault(_name, _share)


def _printable(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _has_surrogates(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


import pytest  # noqa: E402


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):  # type: ignore[no-untyped-def]
    """Agent text in these tests holds lone surrogates on purpose; a failure report quoting one cannot be sent from
    an xdist worker (execnet refuses strings that are not UTF-8), which would crash the whole session instead of
    failing one test. Such reports are made printable here, in the worker."""
    outcome = yield
    report = outcome.get_result()
    if report.longrepr is not None and _has_surrogates(str(report.longrepr)):
        report.longrepr = _printable(str(report.longrepr))
    report.sections = [(_printable(key), _printable(value)) if _has_surrogates(key + value) else (key, value)
                       for key, value in report.sections]
