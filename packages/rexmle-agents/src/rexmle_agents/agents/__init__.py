"""The agents that ship with the harness and need no model: ``sample`` and ``baseline``."""
