"""The paper's scaffold settings as shipped configuration files (``paper-aide.yaml`` ...), usable by name:
``--agent-config @paper-aide.yaml`` or ``agent_config: "@paper-aide.yaml"`` in a plan."""

from __future__ import annotations

from pathlib import Path

CONFIG_DIR = Path(__file__).parent


def shipped_configs() -> list[str]:
    return sorted(p.name for p in CONFIG_DIR.glob("*.yaml"))


def config_file(reference: str) -> Path | None:
    """The file ``reference`` names: a path that exists, else a shipped configuration of that name (with or without
    ``.yaml``); None when neither exists."""
    path = Path(reference).expanduser()
    if path.is_file():
        return path
    name = reference if reference.endswith((".yaml", ".yml")) else f"{reference}.yaml"
    shipped = CONFIG_DIR / Path(name).name
    return shipped if shipped.is_file() and "/" not in reference else None
