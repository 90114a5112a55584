#!/usr/bin/env python
"""Relay benchmark: what the model relay costs per call, and what hostile traffic costs the harness.

The relay runs in this process (the harness side) with its default limits and a scripted model that answers at
once; the clients run in child processes, so this process's resident memory and thread count are the harness's.

1. per-call overhead through the Unix socket (keep-alive connection, as SDKs use; and a new connection per call),
   and through the in-sandbox forwarder's TCP port (run here without a sandbox): median and p95 ms;
2. 100 concurrent callers, 10 calls each: median and p95 latency against the sequential median;
3. harness peak RSS and threads under (a) bodies at the cap (16 MiB of prompt: sequential, then 3 at once),
   (b) 2,000 slow connections holding half-sent headers past the header deadline, (c) 10,000 embeddings inputs
   in one request (refused) and the 2,048 allowed.

    python tools/bench_relay.py [--calls 300]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ALIAS = "rexmle-code"


# ---------------------------------------------------------------------------------------------------------------
# the client side (a child process)


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float = 60.0) -> None:
        super().__init__("relay", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.unix_path)
        self.sock.settimeout(self.timeout)


def _call(connection: http.client.HTTPConnection, body: bytes, path: str = "/v1/chat/completions") -> int:
    connection.request("POST", path, body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    response.read()
    return response.status


def _chat(content: str = "hi") -> bytes:
    return json.dumps({"model": ALIAS, "messages": [{"role": "user", "content": content}]}).encode()


def _timed(calls: int, make: Any) -> dict[str, Any]:
    times, statuses = [], []
    connection = make()
    for _ in range(calls):
        started = time.perf_counter()
        statuses.append(_call(connection, _chat()))
        times.append((time.perf_counter() - started) * 1000)
    return {"times": times, "statuses": statuses}


def client(mode: str, target: str, calls: int) -> dict[str, Any]:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 16384), hard))
    if mode == "sequential":
        return _timed(calls, lambda: _UnixConnection(target))
    if mode == "new-connection":
        times, statuses = [], []
        for _ in range(calls):
            started = time.perf_counter()
            statuses.append(_call(_UnixConnection(target), _chat()))
            times.append((time.perf_counter() - started) * 1000)
        return {"times": times, "statuses": statuses}
    if mode == "forwarder":
        return _timed(calls, lambda: http.client.HTTPConnection("127.0.0.1", int(target), timeout=60))
    if mode == "concurrent":
        results: list[dict[str, Any]] = []
        barrier = threading.Barrier(100)

        def one() -> None:
            connection = _UnixConnection(target)
            barrier.wait()
            results.append(_timed(10, lambda: connection))

        threads = [threading.Thread(target=one) for _ in range(100)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return {"times": [t for r in results for t in r["times"]],
                "statuses": [s for r in results for s in r["statuses"]]}
    if mode == "body-at-cap":
        body = _chat("x" * (16 * 2**20 - 200))
        statuses = [_call(_UnixConnection(target), body) for _ in range(3)]
        concurrent: list[int] = []
        threads = [threading.Thread(target=lambda: concurrent.append(_call(_UnixConnection(target), body)))
                   for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return {"sequential": statuses, "concurrent": sorted(concurrent), "bytes": len(body)}
    if mode == "slow":
        held, started = [], time.monotonic()
        for index in range(2000):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(target)
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: relay\r\n" if index % 2 else
                         b"POST /v1/messages HTTP/1.1\r\nContent-Length: 1000\r\n\r\n{")
            held.append(sock)
        opened_s = time.monotonic() - started
        statuses: dict[str, int] = {}
        for sock in held:
            sock.settimeout(30)
            head = sock.recv(64)
            status = head.split(b" ", 2)[1].decode() if head.startswith(b"HTTP/1.") else "none"
            statuses[status] = statuses.get(status, 0) + 1
            sock.close()
        return {"opened_s": opened_s, "statuses": statuses, "all_answered_s": time.monotonic() - started}
    if mode == "embeddings":
        out = {}
        for inputs in (10_000, 2048):
            body = json.dumps({"model": "e", "input": [f"text number {i} about a noisy slice" for i in range(inputs)]})
            started = time.perf_counter()
            out[str(inputs)] = [_call(_UnixConnection(target), body.encode(), "/v1/embeddings"),
                                (time.perf_counter() - started) * 1000]
        return out
    raise SystemExit(f"unknown client mode {mode!r}")


# ---------------------------------------------------------------------------------------------------------------
# the harness side


def _status() -> tuple[int, int]:
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return int(fields["Threads"]), int(fields["VmRSS"].split()[0]) * 1024


class Peak:
    def __init__(self) -> None:
        self.threads0, self.rss0 = _status()
        self.threads, self.rss = self.threads0, self.rss0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            threads, rss = _status()
            self.threads, self.rss = max(self.threads, threads), max(self.rss, rss)

    def __enter__(self) -> Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _child(mode: str, target: str, calls: int = 0) -> tuple[dict[str, Any], Peak]:
    with Peak() as peak:
        done = subprocess.run([sys.executable, __file__, "--client", mode, target, str(calls)], capture_output=True,
                              text=True, check=True)
    return json.loads(done.stdout), peak


def _ms(times: list[float]) -> str:
    ordered = sorted(times)
    return f"{statistics.median(ordered):.2f} / {ordered[int(len(ordered) * 0.95) - 1]:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--client", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        print(json.dumps(client(args.client[0], args.client[1], int(args.client[2]))))
        return

    from rexmle_agents.models import Model, ModelResponse, RetryPolicy, ScriptedBackend, Usage
    from rexmle_agents.relay import FORWARDER, HashingEmbedder, RelayServer, Route

    def instantly(messages: Any, tools: Any, config: Any) -> ModelResponse:
        backend.requests.clear()  # a test backend keeps every prompt; a real one keeps none
        return ModelResponse(text="ok", usage=Usage(input_tokens=5, output_tokens=1), model="scripted")

    records: list[str] = []
    folder = Path(tempfile.mkdtemp(prefix="rexmle-bench-relay-"))
    backend = ScriptedBackend(instantly)
    model = Model(backend, retry=RetryPolicy(max_attempts=1))
    relay = RelayServer(folder, {ALIAS: Route(ALIAS, "code", "scripted/model", model)},
                        record=lambda message, **data: records.append(message), embedder=HashingEmbedder())
    rows: list[tuple[str, str, str, str, str]] = []
    with relay:
        path = str(relay.socket_path)
        limits = relay.limits

        def row(name: str, result: str, latency: str, peak: Peak) -> None:
            rows.append((name, result, latency, f"{peak.threads} (+{peak.threads - peak.threads0})",
                         f"+{(peak.rss - peak.rss0) / 2**20:.0f}"))

        sequential, peak = _child("sequential", path, args.calls)
        row(f"{args.calls} calls, one keep-alive connection", f"{sequential['statuses'].count(200)} x 200",
            _ms(sequential["times"]), peak)
        fresh, peak = _child("new-connection", path, args.calls)
        row(f"{args.calls} calls, a connection each", f"{fresh['statuses'].count(200)} x 200", _ms(fresh["times"]),
            peak)
        port = _free_port()
        forwarder = subprocess.Popen([sys.executable, str(FORWARDER), "--socket", path, "--port", str(port), "--",
                                      sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
        try:
            _wait_for(port)
            through, peak = _child("forwarder", str(port), args.calls)
        finally:
            os.killpg(forwarder.pid, signal.SIGKILL)  # the forwarder and its stand-in agent
        row(f"{args.calls} calls via the forwarder (TCP)", f"{through['statuses'].count(200)} x 200",
            _ms(through["times"]), peak)
        concurrent, peak = _child("concurrent", path)
        statuses = concurrent["statuses"]
        row("100 concurrent callers x 10 calls", f"{statuses.count(200)} x 200, {len(statuses) - statuses.count(200)}"
            " other", _ms(concurrent["times"]), peak)
        time.sleep(limits.idle_timeout_s + 1)  # let the kept-alive connections of the runs above expire
        started = time.perf_counter()
        body, peak = _child("body-at-cap", path)
        row(f"(a) body at the cap ({body['bytes'] / 2**20:.1f} MiB): 3 in turn, then 3 at once",
            f"{body['sequential']} then {body['concurrent']}", f"{(time.perf_counter() - started) * 1000:.0f} total",
            peak)
        started = time.perf_counter()
        slow, peak = _child("slow", path)
        row(f"(b) 2,000 slow connections (header deadline {limits.header_timeout_s:g} s)",
            ", ".join(f"{n} x {s}" for s, n in sorted(slow["statuses"].items())),
            f"all answered in {slow['all_answered_s']:.1f} s", peak)
        embeddings, peak = _child("embeddings", path)
        row("(c) 10,000 embeddings inputs, then 2,048",
            f"{embeddings['10000'][0]}, then {embeddings['2048'][0]}",
            f"{embeddings['10000'][1]:.0f} / {embeddings['2048'][1]:.0f}", peak)
    widths = [max(len(r[i]) for r in [*rows, HEADER]) for i in range(5)]
    for line in (HEADER, tuple("-" * w for w in widths), *rows):
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)))
    print(f"\nlimits: {limits}")
    print(f"relay: {relay.stats.calls} calls answered, {relay.stats.refused} refused "
          f"({relay.stats.turned_away} turned away at the connection cap); {len(records)} journal records")


HEADER = ("scenario", "answers", "ms median / p95", "peak threads", "peak RSS MiB")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for(port: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit("the forwarder did not listen")


if __name__ == "__main__":
    main()
