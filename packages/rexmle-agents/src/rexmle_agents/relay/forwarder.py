"""Inside the sandbox: forward ``127.0.0.1:PORT`` to the relay's Unix socket, then run the agent.

This file is copied into the relay folder and run by the external agent's own Python, so it uses the standard
library only (Python 3.8+) and imports nothing of rexmle. It listens first, so the endpoint is up before the agent
starts; it starts the agent's services (e.g. ML-Master's validator) and waits until their ports answer; it runs the
agent with the given environment and exits with the agent's status. SIGTERM/SIGINT are passed on to the agent; the
sandbox kills whatever is left when this process ends.

    python forwarder.py --socket /run/rexmle/relay/relay.sock --port 8765 --env K=V \
        [--service PORT JSON_ARGV] [--after JSON_ARGV] -- agent argv...
"""

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

CHUNK = 65536


def pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy bytes until ``source`` ends, then end ``sink``'s sending side (a half-close, as HTTP expects)."""
    try:
        while True:
            data = source.recv(CHUNK)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


def serve(listener: socket.socket, socket_path: str) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(socket_path)
        except OSError as exc:
            sys.stderr.write(f"rexmle forwarder: the relay socket {socket_path} is not reachable: {exc}\n")
            client.close()
            upstream.close()
            continue
        threads = [threading.Thread(target=pump, args=(client, upstream), daemon=True),
                   threading.Thread(target=pump, args=(upstream, client), daemon=True)]
        for thread in threads:
            thread.start()
        threading.Thread(target=_close_after, args=(threads, client, upstream), daemon=True).start()


def _close_after(threads: list, *sockets: socket.socket) -> None:
    for thread in threads:
        thread.join()
    for sock in sockets:
        sock.close()


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
    listener.listen(64)
    threading.Thread(target=serve, args=(listener, args.socket), daemon=True).start()

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
