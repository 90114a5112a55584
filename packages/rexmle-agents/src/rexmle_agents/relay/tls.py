"""The providers' own host names, answered by the relay: an agent that calls ``https://api.openai.com`` (AIDE sends
gpt-* and o* models there, and gemini-* to Google's host, whatever base URL is set) reaches the relay instead.

Inside the sandbox ``HTTPS_PROXY`` points at the relay, so such a client asks it to ``CONNECT api.openai.com:443``.
For the hosts in :data:`PROVIDER_HOSTS` the relay answers ``200``, then speaks TLS on that connection with a
certificate for the host signed by a certificate authority made for this relay alone, and serves the requests that
arrive through it as any other (same endpoints, limits, journal). The agent trusts that authority through
``SSL_CERT_FILE`` (its certificate, never its key, is in the relay folder); every other ``CONNECT`` is refused as
before. The keys are made with the ``openssl`` command in a private folder and deleted once loaded.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
import tempfile
from pathlib import Path

from rexmle_grade.errors import ConfigurationError

# host -> what it is (the README's table of what each original agent sends where)
PROVIDER_HOSTS = {
    "api.openai.com": "OpenAI API (AIDE's gpt-*/o* models: the responses API)",
    "generativelanguage.googleapis.com": "Gemini API (AIDE's gemini-* models: its OpenAI-compatible endpoint)",
    "api.anthropic.com": "Anthropic API",
}
CA_FILE = "provider-ca.pem"  # in the relay folder, read by the agent (SSL_CERT_FILE)
DAYS = 30  # the certificates' validity: longer than any run
HANDSHAKE_TIMEOUT_S = 30.0


class ProviderTLS:
    """A certificate authority and one certificate for every provider host; ``context`` serves them."""

    def __init__(self, relay_folder: Path, hosts: tuple[str, ...] = tuple(PROVIDER_HOSTS)) -> None:
        self.hosts = tuple(hosts)
        self.ca_file = Path(relay_folder) / CA_FILE
        openssl = shutil.which("openssl")
        if openssl is None:
            raise ConfigurationError("the `openssl` command is needed to answer the providers' host names inside "
                                     "the sandbox, and none is on PATH",
                                     hint="install OpenSSL (apt-get install openssl, dnf install openssl)")
        private = Path(tempfile.mkdtemp(prefix="rexmle-relay-tls-"))  # 0700: the keys never reach the sandbox
        try:
            self._make(openssl, private)
            self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.context.minimum_version = ssl.TLSVersion.TLSv1_2
            self.context.load_cert_chain(private / "host.pem", private / "host.key")
            shutil.copyfile(private / "ca.pem", self.ca_file)
            self.ca_file.chmod(0o644)
        finally:
            shutil.rmtree(private, ignore_errors=True)

    def _make(self, openssl: str, folder: Path) -> None:
        names = ",".join(f"DNS:{host}" for host in self.hosts)
        (folder / "host.ext").write_text(
            f"subjectAltName={names}\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
            "extendedKeyUsage=serverAuth\nsubjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n")
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        steps = [
            [openssl, "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", str(DAYS),
             "-subj", "/CN=rexmle relay (this run only)", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
            [openssl, "req", *ec, "-keyout", "host.key", "-out", "host.csr", "-subj", f"/CN={self.hosts[0]}"],
            [openssl, "x509", "-req", "-in", "host.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-set_serial",
             "1", "-days", str(DAYS), "-extfile", "host.ext", "-out", "host.pem"],
        ]
        for argv in steps:
            done = subprocess.run(argv, cwd=folder, capture_output=True, text=True, timeout=60, check=False)
            if done.returncode != 0:
                raise ConfigurationError(f"`{' '.join(argv[:3])}` failed making the relay's certificate: "
                                         f"{done.stderr.strip()[-500:]}",
                                         hint="check that `openssl version` is OpenSSL 1.1.1 or newer")

    def serves(self, target: str) -> bool:
        """Whether a ``CONNECT`` target (``host:port``) is a provider host on the HTTPS port."""
        host, _, port = target.rpartition(":")
        return port == "443" and host.lower() in self.hosts
