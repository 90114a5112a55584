"""Executors: where runs execute. ``local`` is a process pool on this machine with GPU-slot assignment; ``slurm``
submits job arrays through submitit (``submitit-local`` runs the same job code as local processes, for tests and
debugging)."""

from rexmle_agents.executors.common import EXECUTORS, run_specs

__all__ = ["EXECUTORS", "run_specs"]
