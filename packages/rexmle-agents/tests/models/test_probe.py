"""A wrong model endpoint is found at once: the probe opens one connection per distinct endpoint (a real loopback
port that refuses, a real loopback HTTP server, a proxy from the environment) before `rexmle run` and `rexmle
analyse` start (one line, exit code 2, nothing written), and a Model retries a refused connection only once."""

from __future__ import annotations

import logging
import socket
from dataclasses import replace
from pathlib import Path

import pytest

from rexmle_agents.models import TransientModelAPIError, get_model
from rexmle_agents.models.probe import EndpointUnreachableError, base_url, endpoints, require_reachable, unreachable
from rexmle_grade.cli import main
from rexmle_grade.errors import ModelAPIError

PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


@pytest.fixture(autouse=True)
def _no_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


def refusing_port() -> int:
    """A loopback port nothing listens on: bound (so the system picked a free one), then closed."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("error: ") == 1, err
    return " ".join(err.split())


def test_one_probe_per_endpoint_refused_port_reported_listening_server_passes(server) -> None:
    port = refusing_port()
    dead_a = f"openai-compatible/a@http://127.0.0.1:{port}/v1"
    dead_c = f"openai-compatible/c@http://127.0.0.1:{port}/other"
    alive = f"openai-compatible/b@{server.url}/v1"
    models = [dead_a, alive, "replay:/nowhere/cassette.jsonl", "scripted/model", dead_c]
    found = endpoints(models)
    assert [(e.port, e.models) for e in found] == [(port, (dead_a, dead_c)), (found[1].port, (alive,))]
    problems = unreachable(models)
    assert [(e.port, problem) for e, problem in problems] == [
        (port, f"connection refused: nothing listens at 127.0.0.1:{port}")]
    with pytest.raises(EndpointUnreachableError) as info:
        require_reachable(models)
    assert info.value.exit_code == 2 and f"{dead_a}, {dead_c}" in info.value.message
    assert "base URL" not in info.value.message and "$OPENAI_BASE_URL" in info.value.hint
    require_reachable([alive, "replay:/nowhere/cassette.jsonl"])
    assert server.requests == []  # a connection, never a request: no key checked, no token spent


def test_providers_default_urls_and_their_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    assert base_url("openai/gpt-5") == "https://api.openai.com/v1"
    assert base_url("anthropic/claude-sonnet-4-5") == "https://api.anthropic.com"
    assert base_url("google/gemini-2.5-pro").startswith("https://generativelanguage.googleapis.com/")
    assert base_url("azure/my-deployment") is None  # unset: the credential check names the variable
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("AZURE_OPENAI_ENDPOINT", "https://res.openai.azure.com")
    assert base_url("openai/gpt-5") == "http://127.0.0.1:9/v1"
    assert [(e.host, e.port) for e in endpoints(["openai/gpt-5", "azure/my-deployment"])] == [
        ("127.0.0.1", 9), ("res.openai.azure.com", 443)]


def test_an_endpoint_behind_a_proxy_is_probed_through_the_proxy(server, monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDKs honour the proxy variables, so the probe connects where they would: to the proxy."""
    port = refusing_port()
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{port}")
    alive = f"openai-compatible/b@{server.url}/v1"
    [(endpoint, problem)] = unreachable([alive])
    assert endpoint.proxy == f"http://127.0.0.1:{port}" and "connection refused" in problem
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    assert unreachable([alive]) == []


@pytest.mark.parametrize("provider", ["openai-compatible/m", "anthropic/claude-haiku-4-5"])
def test_a_refused_connection_is_retried_once_then_permanent(provider, fast_retry, caplog) -> None:
    url = f"http://127.0.0.1:{refusing_port()}"
    if provider.startswith("openai"):
        model = get_model(f"{provider}@{url}/v1", retry=replace(fast_retry, max_attempts=8))
    else:
        model = get_model(provider, api_key="sk-test", base_url=url, retry=replace(fast_retry, max_attempts=8))
    with caplog.at_level(logging.WARNING, logger="rexmle_agents.models.base"), \
            pytest.raises(ModelAPIError) as info:
        model.generate("hi")
    assert not isinstance(info.value, TransientModelAPIError)  # the relay answers it 400, agents do not retry
    assert f"connection refused at {url}/" in info.value.message and "refused 2 times" in info.value.message
    assert "check the base URL" in info.value.hint
    retries = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
    assert len(retries) == 1 and "connection refused" in retries[0]


def test_rexmle_analyse_with_a_dead_judge_endpoint_is_one_line_and_writes_nothing(tmp_path: Path, capsys) -> None:
    from rexmle_agents.analysis.examples import unpack

    group = unpack(tmp_path / "examples")
    out = tmp_path / "analysis"
    judge = f"openai-compatible/judge@http://127.0.0.1:{refusing_port()}/v1"
    assert main(["analyse", str(group), "-o", str(out), "--judge", judge, "--no-view", "--no-figures"]) == 2
    assert "connection refused: nothing listens at 127.0.0.1" in one_line_error(capsys)
    assert not out.exists()


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rexmle_tasks.pipeline import prepare_task, task_dirs
    from rexmle_tasks.registry import get_task

    root = tmp_path_factory.mktemp("probe-data")
    task = get_task("ldct-iqa")
    prepare_task(task, task_dirs(task, root), synthetic=True, cases=10, seed=0, force=False)
    return root


def test_rexmle_run_with_a_dead_endpoint_is_one_line_and_starts_nothing(data_root: Path, tmp_path: Path,
                                                                        capsys) -> None:
    runs = tmp_path / "runs"
    model = f"openai-compatible/m@http://127.0.0.1:{refusing_port()}/v1"
    assert main(["--data-dir", str(data_root), "run", "--agent", "sample", "--task", "ldct-iqa", "--model", model,
                 "--runs-dir", str(runs), "--sandbox", "none", "--allow-unsandboxed"]) == 2
    message = one_line_error(capsys)
    assert "model endpoint http://127.0.0.1:" in message and "connection refused" in message
    assert not runs.exists()
