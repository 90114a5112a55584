"""Executors: where runs execute. ``local`` is a process pool on this machine with GPU-slot assignment; ``slurm``
submits a group as SLURM job arrays (one run per array task, resumed from its journal after a requeue) and reads
back what SLURM says about each job (``cluster.json``); ``submitit-local`` runs the runs as local processes through
submitit, for tests and debugging."""

from rexmle_agents.executors.common import EXECUTORS, run_specs

__all__ = ["EXECUTORS", "run_specs"]
