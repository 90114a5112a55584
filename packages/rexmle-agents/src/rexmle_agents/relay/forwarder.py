"""Inside the sandbox: forward ``127.0.0.1:PORT`` to the relay's Unix socket, then run the agent.

This file is copied into the relay folder and run by the external agent's own Python, so it uses the standard
library only (Python 3.8+) and imports nothing of rexmle. It listens first, so the endpoint is up before the agent
starts; it starts the agent's services (e.g. ML-Master's validator) and waits until their ports answer; it runs the
agent with the given environment and exits with the agent's status. SIGTERM/SIGINT are passed on to the agent; the
sandbox kills whatever is left when this process ends.

Forwarding is one event loop on one thread, started before the agent: serving a connection starts no thread and
no process, so agent code that exhausts the sandbox's process limit cannot stop the agent's model calls. What it
cannot serve (more than ``MAX_CONNECTIONS`` at once, no file descriptor left, the relay unreachable) is answered
``503`` with a JSON error the agent's SDK reads and retries, and closed; the loop itself never ends before the
agent does. Each kind of fault is written once to stderr and reported once to the relay, which journals it as a
warning of the run.

    python forwarder.py --socket /run/rexmle/relay/relay.sock --port 8765 --env K=V \
        [--service PORT JSON_ARGV] [--after JSON_ARGV] -- agent argv...
"""

import argparse
import contextlib
import errno
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time

CHUNK = 65536
MAX_CONNECTIONS = 256  # served at once (two file descriptors each); the relay itself serves fewer at once
MAX_BUFFERED = 4 * CHUNK  # per direction: reading from a side pauses while its peer has this much to take
LINGER_S = 2.0  # after its answer, a client's unread request bytes are drained this long, so TCP does not reset
ACCEPT_PAUSE_S = 0.1  # after an accept failed for lack of descriptors or memory
FAULT_PATH = "/rexmle/forwarder-fault"
READ, WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE


def error_response(status, message):
    """An HTTP answer with a JSON error in OpenAI's shape (the agent's SDK parses it, and retries a 503)."""
    reason = {503: "Service Unavailable", 502: "Bad Gateway"}.get(status, "Error")
    body = json.dumps({"error": {"message": "rexmle forwarder: " + message, "type": "overloaded",
                                 "param": None, "code": "overloaded"}}).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Retry-After: 2\r\nConnection: close\r\n\r\n")
    return head.encode("latin-1") + body


class Pair:
    """A client connection and its relay connection (or none: then the client gets ``answer`` and is closed)."""

    def __init__(self, forwarder, client, upstream, answer=b""):
        self.forwarder = forwarder
        self.client = client
        self.upstream = upstream
        self.connecting = upstream is not None
        self.peer = {client: upstream, upstream: client} if upstream is not None else {client: None}
        self.pending = {client: bytearray(answer)}  # bytes waiting to be written to each socket
        self.ended = {client: False}  # the socket's sending side ended (EOF read) or failed
        self.shut = {client: False}  # our sending side to the socket is shut
        if upstream is not None:
            self.pending[upstream] = bytearray()
            self.ended[upstream] = False
            self.shut[upstream] = False
        else:
            self.ended[None] = True  # the answer is all there is to send
        self.linger_until = None

    def sockets(self):
        return [s for s in (self.client, self.upstream) if s is not None]

    def interest(self, sock):
        events = 0
        peer = self.peer[sock]
        peer_full = peer is not None and not self.shut[peer] and len(self.pending[peer]) >= MAX_BUFFERED
        if not self.ended[sock] and not peer_full:
            events |= READ
        if self.pending[sock] or (sock is self.upstream and self.connecting):
            events |= WRITE
        return events

    def on_event(self, sock, mask):
        if mask & WRITE:
            if sock is self.upstream and self.connecting:
                failure = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if failure:
                    raise OSError(failure, os.strerror(failure))
                self.connecting = False
            if self.pending[sock]:
                try:
                    sent = sock.send(self.pending[sock])
                except (BlockingIOError, InterruptedError):
                    sent = 0
                except OSError:  # the other end went away: what it was sent is dropped, the rest still flows
                    self.pending[sock] = bytearray()
                    self.shut[sock] = True
                    sent = 0
                del self.pending[sock][:sent]
        if mask & READ:
            try:
                data = sock.recv(CHUNK)
            except (BlockingIOError, InterruptedError):
                data = None
            except OSError:
                data = b""
            if data == b"":
                self.ended[sock] = True
            elif data:
                peer = self.peer[sock]
                if peer is not None and not self.shut[peer]:
                    self.pending[peer] += data
        self.settle()

    def settle(self):
        """Pass half-closes on, and close the pair once both directions are done."""
        for sock in self.sockets():
            source = self.peer[sock]
            if source is None:
                source_done = True
            else:
                source_done = self.ended[source]
            if source_done and not self.pending[sock] and not self.shut[sock]:
                self.shut[sock] = True
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_WR)
        answered = self.shut[self.client]
        upstream_done = self.upstream is None or (self.ended[self.upstream] and self.shut[self.upstream])
        if answered and self.ended[self.client] and upstream_done:
            self.forwarder.close_pair(self)
            return
        if answered and self.linger_until is None:
            self.linger_until = time.monotonic() + LINGER_S
        self.forwarder.update(self)

    def overdue(self, now):
        return self.linger_until is not None and now >= self.linger_until


class Forwarder:
    """The event loop: accepts on ``listener``, connects each client to the relay's socket, pumps both ways."""

    def __init__(self, listener, socket_path, max_connections=MAX_CONNECTIONS, report=True):
        self.listener = listener
        self.socket_path = socket_path
        self.max_connections = max_connections
        self.report_to_relay = report
        self.selector = selectors.DefaultSelector()
        self.pairs = set()
        self.faults = set()
        self.accept_resumes = None
        self.stopped = False

    def run(self):
        self.listener.setblocking(False)
        self.selector.register(self.listener, READ, None)
        while not self.stopped:
            try:
                self.step()
            except Exception as exc:  # the loop outlives any one failure; it is said once per kind
                self.fault("loop-" + type(exc).__name__, repr(exc))
                time.sleep(0.05)

    def step(self):
        now = time.monotonic()
        if self.accept_resumes is not None and now >= self.accept_resumes:
            self.accept_resumes = None
            self.selector.register(self.listener, READ, None)
        for pair in [p for p in self.pairs if p.overdue(now)]:
            self.close_pair(pair)
        for key, mask in self.selector.select(timeout=0.5):
            if key.data is None:
                self.accept()
                continue
            pair = key.data
            if pair not in self.pairs:
                continue
            try:
                pair.on_event(key.fileobj, mask)
            except OSError as exc:
                self.upstream_failed(pair, exc)

    def accept(self):
        try:
            client, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                self.fault("accept-" + (errno.errorcode.get(exc.errno) or str(exc.errno)), str(exc))
                self.selector.unregister(self.listener)  # it stays readable: pause instead of spinning
                self.accept_resumes = time.monotonic() + ACCEPT_PAUSE_S
            return
        client.setblocking(False)
        with contextlib.suppress(OSError):  # answers leave in pieces: no 40 ms wait for the client's ACK
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if len(self.pairs) >= self.max_connections:
            self.fault("busy", f"more than {self.max_connections} connections at once")
            self.add(Pair(self, client, None, error_response(503, f"more than {self.max_connections} model "
                                                             "connections at once; retry later")))
            return
        try:
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError as exc:
            self.fault("socket-" + (errno.errorcode.get(exc.errno or 0) or "error"), str(exc))
            self.add(Pair(self, client, None, error_response(503, f"no socket for the relay ({exc})")))
            return
        upstream.setblocking(False)
        pair = Pair(self, client, upstream)
        self.add(pair)
        try:
            upstream.connect(self.socket_path)
            pair.connecting = False
        except (BlockingIOError, InterruptedError) as exc:
            if exc.errno == errno.EAGAIN:  # a Unix socket's backlog is full: no waiting for it
                self.upstream_failed(pair, exc)
        except OSError as exc:
            self.upstream_failed(pair, exc)
        else:
            self.update(pair)

    def add(self, pair):
        self.pairs.add(pair)
        for sock in pair.sockets():
            self.selector.register(sock, pair.interest(sock) or READ, pair)
        pair.settle()

    def update(self, pair):
        if pair not in self.pairs:
            return
        for sock in pair.sockets():
            events = pair.interest(sock)
            key = self.selector.get_map().get(sock)
            if events and key is None:
                self.selector.register(sock, events, pair)
            elif events and key.events != events:
                self.selector.modify(sock, events, pair)
            elif not events and key is not None:
                self.selector.unregister(sock)

    def upstream_failed(self, pair, exc):
        """The relay could not be reached: the client is answered 503 instead (if nothing was sent to it yet)."""
        name = errno.errorcode.get(getattr(exc, "errno", None) or 0) or type(exc).__name__
        self.fault("relay-" + name, f"{self.socket_path}: {exc}")
        client = pair.client
        self.close_pair(pair, keep_client=True)
        answer = error_response(503, f"the relay is not reachable ({name}); retry later")
        self.add(Pair(self, client, None, answer))

    def close_pair(self, pair, keep_client=False):
        self.pairs.discard(pair)
        for sock in pair.sockets():
            if sock in self.selector.get_map():
                self.selector.unregister(sock)
            if sock is not pair.client or not keep_client:
                sock.close()

    def fault(self, kind, detail):
        """Said once per kind: on stderr (the agent's log) and to the relay (the run's journal, as a warning)."""
        if kind in self.faults or len(self.faults) >= 32:
            return
        self.faults.add(kind)
        try:
            sys.stderr.write(f"rexmle forwarder: {kind}: {detail}\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        if self.report_to_relay and not kind.startswith("relay-"):
            report_fault(self.socket_path, kind, detail)


def report_fault(socket_path, kind, detail):
    body = json.dumps({"kind": kind, "detail": str(detail)[:300]}).encode()
    request = (f"POST {FAULT_PATH} HTTP/1.1\r\nHost: relay\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode("latin-1") + body
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(1.0)
            sock.connect(socket_path)
            sock.sendall(request)
            sock.recv(4096)
    except OSError:  # the relay is what failed: stderr has it
        pass


def wait_for_port(port: int, timeout_s: float, process: "subprocess.Popen[bytes]") -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            time.sleep(0.1)
    return False


def main(argv: list) -> int:
    if "--" not in argv:
        sys.stderr.write("rexmle forwarder: no agent command (expected: ... -- COMMAND)\n")
        return 2
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="forwarder.py")
    parser.add_argument("--socket", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--env", action="append", default=[])
    parser.add_argument("--service", nargs=2, action="append", default=[], metavar=("PORT", "JSON_ARGV"))
    parser.add_argument("--after", action="append", default=[], metavar="JSON_ARGV")
    args = parser.parse_args(argv[:split])
    command = argv[split + 1:]
    if not command:
        sys.stderr.write("rexmle forwarder: the agent command is empty\n")
        return 2

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", args.port))
    listener.listen(256)
    # started before the agent, while threads can still be made: it is the only one forwarding ever needs
    threading.Thread(target=Forwarder(listener, args.socket).run, name="rexmle-forwarder", daemon=True).start()

    env = dict(os.environ)
    for item in args.env:
        name, _, value = item.partition("=")
        env[name] = value

    services = []
    for port, service in args.service:
        process = subprocess.Popen(json.loads(service), env=env)
        services.append(process)
        if not wait_for_port(int(port), 60.0, process):
            sys.stderr.write(f"rexmle forwarder: the service {service} did not answer on port {port}\n")
            for started in services:
                started.kill()
            return 3

    agent = subprocess.Popen(command, env=env)

    def pass_on(signum: int, _frame: object) -> None:
        agent.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, pass_on)
    status = agent.wait()
    sys.stdout.flush()
    for after in args.after:
        print(f"rexmle forwarder: after the agent (exit status {status}): {after}", flush=True)
        subprocess.run(json.loads(after), env=env)
    for process in services:
        process.kill()
    listener.close()
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
