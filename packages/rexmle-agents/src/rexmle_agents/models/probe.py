"""Probe model endpoints before a run or an analysis starts: one TCP connection per distinct endpoint.

A wrong base URL otherwise shows only once the first call has been retried for minutes. The probe opens (and
closes) one connection to each endpoint's host and port, or to the proxy the SDKs would go through: no request is
sent, so no key is checked and no token is spent. Replayed (``replay:``) and test (``scripted/``) models call
nothing and are skipped.
"""

from __future__ import annotations

import os
import socket
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

from rexmle_agents.models.registry import AZURE_ENDPOINT_ENV, PROVIDERS, parse_model_string
from rexmle_grade.errors import ModelAPIError, UserInputError

PROBE_TIMEOUT_S = 5.0
# Where the SDKs send a provider's calls when no base URL is given; they read these variables first.
DEFAULT_BASE_URLS = {
    "openai": ("OPENAI_BASE_URL", "https://api.openai.com/v1"),
    "anthropic": ("ANTHROPIC_BASE_URL", "https://api.anthropic.com"),
    "google": (None, "https://generativelanguage.googleapis.com/v1beta/openai/"),
    "azure": (AZURE_ENDPOINT_ENV, None),
}


class EndpointUnreachableError(ModelAPIError):
    """A model endpoint refused, could not be resolved, or did not accept a connection in time."""


@dataclass(frozen=True)
class Endpoint:
    """Where the calls of ``models`` go (``url``), and the ``host``:``port`` a connection is opened to: the
    endpoint's own, or that of the proxy (``proxy``) the environment routes it through."""

    url: str
    host: str
    port: int
    proxy: str | None
    models: tuple[str, ...]

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def base_url(model: str) -> str | None:
    """The base URL a model string's calls go to, or None when it calls nothing (replay and test models) or its
    endpoint is not configured (a missing variable, which the credential check reports)."""
    if model.startswith("replay:") or model.split("/", 1)[0] not in PROVIDERS:
        return None
    spec = parse_model_string(model)
    if spec.base_url is not None:
        return spec.base_url
    variable, default = DEFAULT_BASE_URLS[spec.provider]
    return (os.environ.get(variable) if variable else None) or default


def endpoints(models: Iterable[str]) -> list[Endpoint]:
    """The distinct endpoints of ``models`` (by the host and port a connection goes to), in first-seen order."""
    found: dict[tuple[str, int], Endpoint] = {}
    for model in models:
        url = base_url(model)
        if url is None:
            continue
        host, port, proxy = _connect_address(url)
        known = found.get((host, port))
        if known is None:
            found[(host, port)] = Endpoint(url, host, port, proxy, (model,))
        elif model not in known.models:
            found[(host, port)] = Endpoint(known.url, host, port, proxy, (*known.models, model))
    return list(found.values())


def _connect_address(url: str) -> tuple[str, int, str | None]:
    parts = _split(url)
    host = parts.hostname or ""
    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    if proxy and not urllib.request.proxy_bypass_environment(host):
        via = _split(proxy if "://" in proxy else f"http://{proxy}")
        return via.hostname or "", _port(via), proxy
    return host, _port(parts), None


def _split(url: str) -> SplitResult:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserInputError(f"model endpoint {url!r} is not an http(s) URL with a host",
                             hint="e.g. openai-compatible/NAME@http://localhost:8000/v1")
    return parts


def _port(parts: SplitResult) -> int:
    try:
        explicit = parts.port
    except ValueError as exc:
        raise UserInputError(f"model endpoint {parts.geturl()!r} has an invalid port: {exc}") from None
    return explicit or (443 if parts.scheme == "https" else 80)


def probe(endpoint: Endpoint, *, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Why a connection to ``endpoint`` cannot be opened, or None when it can (it is closed at once)."""
    try:
        with socket.create_connection((endpoint.host, endpoint.port), timeout=timeout_s):
            return None
    except ConnectionRefusedError:
        return f"connection refused: nothing listens at {endpoint.address}"
    except socket.gaierror as exc:
        return f"cannot resolve host {endpoint.host!r} ({exc.strerror})"
    except TimeoutError:
        return f"no connection to {endpoint.address} within {timeout_s:g} s"
    except OSError as exc:
        return f"cannot connect to {endpoint.address}: {exc.strerror or exc}"


def unreachable(models: Iterable[str], *, timeout_s: float = PROBE_TIMEOUT_S) -> list[tuple[Endpoint, str]]:
    """Each endpoint of ``models`` that cannot be reached, with why; one connection attempt per endpoint."""
    problems = []
    for endpoint in endpoints(models):
        problem = probe(endpoint, timeout_s=timeout_s)
        if problem is not None:
            problems.append((endpoint, problem))
    return problems


def describe(endpoint: Endpoint, problem: str) -> str:
    via = f" through the proxy {endpoint.proxy}" if endpoint.proxy else ""
    return f"model endpoint {endpoint.url}{via} ({', '.join(endpoint.models)}): {problem}"


def require_reachable(models: Iterable[str], *, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Raise :class:`EndpointUnreachableError` (one line, exit code 2) naming every endpoint of ``models`` that
    cannot be reached."""
    problems = unreachable(models, timeout_s=timeout_s)
    if not problems:
        return
    text = "; ".join(describe(endpoint, problem) for endpoint, problem in problems)
    raise EndpointUnreachableError(
        text, hint="start the server, or fix the URL in the model string (openai-compatible/NAME@URL) or the "
                   "variable that sets it ($OPENAI_BASE_URL, $ANTHROPIC_BASE_URL, $AZURE_OPENAI_ENDPOINT); nothing "
                   "was started")
