"""Original third-party agents (AIDE, R&D-Agent, ML-Master, or any other) run unchanged in rexmle's harness: an
external-agent spec (YAML) says how to build the agent's own environment, start it inside the sandbox with its
model traffic through the relay (:mod:`rexmle_agents.relay`), and read its results back into the run format."""

from rexmle_agents.external.spec import ExternalAgentSpec, ExternalSpecError, builtin_spec_names, load_spec

__all__ = ["ExternalAgentSpec", "ExternalSpecError", "builtin_spec_names", "external_agent_class", "load_spec"]


def __getattr__(name: str) -> object:
    if name == "external_agent_class":  # the agent module imports the harness: only when asked for
        from rexmle_agents.external.agent import external_agent_class

        return external_agent_class
    raise AttributeError(name)
