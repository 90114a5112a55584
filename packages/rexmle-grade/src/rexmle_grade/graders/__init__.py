"""Per-challenge graders; every module here registers its graders with ``register_grader``."""
