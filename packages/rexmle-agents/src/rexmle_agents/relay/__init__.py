"""The model relay: agents that call model APIs themselves (the original AIDE, R&D-Agent, ML-Master) reach the
run's models through it, from inside the sandbox, without network or API key. See :mod:`.server`."""

from pathlib import Path

from rexmle_agents.relay.protocol import ANTHROPIC, CHAT, RESPONSES, RelayRequest
from rexmle_agents.relay.server import (
    SOCKET_NAME,
    STATUS_BUDGET,
    HashingEmbedder,
    RelayLimits,
    RelayServer,
    RelayStats,
    Route,
)

FORWARDER = Path(__file__).with_name("forwarder.py")
FORWARDER_NAME = FORWARDER.name

__all__ = ["ANTHROPIC", "CHAT", "FORWARDER", "FORWARDER_NAME", "RESPONSES", "SOCKET_NAME", "STATUS_BUDGET",
           "HashingEmbedder", "RelayLimits", "RelayRequest", "RelayServer", "RelayStats", "Route"]
