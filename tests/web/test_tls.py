"""A head serving https with its own certificate: local nodes, clients and the CLI pin it through
BURLA_HEAD_CERT; without it (or with another certificate) they fail clearly instead of trusting it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from burla.errors import HeadUnreachable
from tests.conftest import REPO, run_client, start_head
from tests.support import functions
from tests.support.helpers import PRELUDE, wait_until


def _burla(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "burla", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=120, env=env)


@pytest.fixture
def tls_head(tmp_path):
    head = start_head(tmp_path / "config", local_nodes=1, extra=["--tls-self-signed"])
    try:
        yield head
    finally:
        head.stop()


def test_an_https_head_runs_jobs_for_clients_that_pin_its_certificate(tls_head):
    cert = tls_head.config_dir / "head-cert.pem"
    assert tls_head.url.startswith("https://127.0.0.1:") and cert.exists()
    assert oct((tls_head.config_dir / "head-key.pem").stat().st_mode & 0o777) == "0o600"
    env = dict(os.environ, **tls_head.env(), BURLA_HEAD_CERT=str(cert))

    def one_node() -> bool:
        done = _burla("nodes", "list", env=env)
        return done.returncode == 0 and len(json.loads(done.stdout)["data"]) == 1

    wait_until(one_node, what="the local node joined over https")  # it pinned the head's certificate too
    client = tls_head.client(head_cert=str(cert))
    assert client.remote_parallel_map(functions.double, [1, 2, 3], spinner=False) == [2, 4, 6]
    # A user's client process pins it through BURLA_HEAD_CERT, as the CLI above does.
    done = run_client(PRELUDE + "print(remote_parallel_map(functions.double, [4, 5], spinner=False))\n", env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[8, 10]"


def test_clients_without_the_certificate_are_refused_with_the_fix(tls_head, tmp_path):
    with pytest.raises(HeadUnreachable, match="does not trust.*BURLA_HEAD_CERT"):
        tls_head.client(head_cert=None).remote_parallel_map(functions.double, [1], spinner=False)
    # Another self-signed certificate (for the same names) is not this head's: refused too.
    from burla.web.tls import make_self_signed

    other, _ = make_self_signed(["127.0.0.1", "localhost"], tmp_path / "other")
    for cert in (None, other):
        env = dict(os.environ, **tls_head.env())
        env.pop("BURLA_HEAD_CERT", None)
        if cert is not None:
            env["BURLA_HEAD_CERT"] = str(cert)
        done = _burla("cluster", "status", env=env)
        assert done.returncode == 6, done.stdout + done.stderr
        error = json.loads(done.stdout)["error"]
        assert error["code"] == "head_untrusted" and "BURLA_HEAD_CERT" in error["remediation"]


def test_tls_options_are_checked(tmp_path):
    env = dict(os.environ, BURLA_CONFIG_DIR=str(tmp_path))
    lone_cert = tmp_path / "cert.pem"
    lone_cert.write_text("not a certificate")
    for args, message in [
        (["--tls-cert", str(lone_cert)], "--tls-cert and --tls-key go together"),
        (["--tls-cert", str(lone_cert), "--tls-key", str(lone_cert)], "can't use the certificate"),
        (["--url", "10.0.0.5:5001"], "--url must start with http:// or https://"),
    ]:
        done = subprocess.run([sys.executable, "-m", "burla", "head", "serve", "--port", "0", *args], env=env,
                              cwd=REPO, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr, (args, done.stderr)


def test_a_head_other_machines_can_reach_serves_https_unless_told_not_to(tmp_path):
    env = dict(os.environ, BURLA_CONFIG_DIR=str(tmp_path))
    env.pop("BURLA_CLUSTER_DASHBOARD_URL", None)
    # 127.0.0.2 is loopback to the OS but not one of the head's loopback names: it counts as "other machines".
    process = subprocess.Popen([sys.executable, "-m", "burla", "head", "serve", "--host", "127.0.0.2", "--port", "0",
                                "--ephemeral"], env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    try:
        line = process.stdout.readline()
        assert line.startswith("burla head serving at https://127.0.0.2:"), line
        assert (tmp_path / "head-cert.pem").exists()
    finally:
        process.terminate()
        process.wait(15)
        process.stdout.close()
        process.stderr.close()
    done = subprocess.run([sys.executable, "-m", "burla", "head", "serve", "--host", "127.0.0.2", "--no-tls",
                           "--tls-self-signed"], env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--no-tls contradicts" in done.stderr


def _authority_and_leaf(directory) -> tuple[str, str, str]:
    """A certificate authority (as if publicly trusted) and a certificate it signed for 127.0.0.1."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key, leaf_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Some Public CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(1).not_valid_before(now - datetime.timedelta(hours=1))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True).sign(ca_key, hashes.SHA256()))
    leaf = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "elsewhere")]))
            .issuer_name(ca_name).public_key(leaf_key.public_key()).serial_number(2)
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False).sign(ca_key, hashes.SHA256()))
    paths = [directory / "ca.pem", directory / "leaf.pem", directory / "leaf-key.pem"]
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(leaf_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                serialization.NoEncryption()))
    return tuple(str(p) for p in paths)


def test_a_pinned_certificate_is_the_only_one_trusted_not_the_systems_authorities(tmp_path):
    from burla.web.tls import make_self_signed

    ca, leaf, leaf_key = _authority_and_leaf(tmp_path)
    head = start_head(tmp_path / "config", local_nodes=0, extra=["--tls-cert", leaf, "--tls-key", leaf_key])
    try:
        # The authority is trusted system-wide (SSL_CERT_FILE): an unpinned client accepts the head...
        env = dict(os.environ, SSL_CERT_FILE=ca, BURLA_CLUSTER_DASHBOARD_URL=head.url, BURLA_CLUSTER_TOKEN=head.token,
                   BURLA_CONFIG_DIR=str(tmp_path / "client"))
        env.pop("BURLA_HEAD_CERT", None)
        done = _burla("cluster", "status", env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        # ...but a client pinning another certificate refuses it, however well it is signed.
        pinned, _ = make_self_signed(["127.0.0.1"], tmp_path / "pinned")
        done = _burla("cluster", "status", env={**env, "BURLA_HEAD_CERT": str(pinned)})
        assert done.returncode == 6 and json.loads(done.stdout)["error"]["code"] == "head_untrusted", done.stdout
    finally:
        head.stop()


TRUST_ON_FIRST_USE = """
import asyncio, ssl, sys
from burla.web.aiohttp_import import import_aiohttp
import_aiohttp()
import aiohttp
from aiohttp import web

async def main():
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(sys.argv[1], sys.argv[2])
    app = web.Application()
    app.router.add_get("/", lambda request: web.Response(text="hello"))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        async with aiohttp.ClientSession() as session:  # aiohttp's default, verified context
            async with session.get(f"https://127.0.0.1:{port}/") as response:
                print(await response.text())
    except aiohttp.ClientConnectorCertificateError:
        print("untrusted")
    finally:
        await runner.cleanup()

asyncio.run(main())
"""


def test_aiohttp_imported_by_heads_and_nodes_still_trusts_the_systems_authorities(tmp_path):
    # Heads and nodes import aiohttp with its default contexts reading the system's authorities
    # on first use instead of at import: a certificate those authorities sign must still pass,
    # and one they don't must still fail.
    from burla.web.tls import make_self_signed

    trusted_cert, trusted_key = make_self_signed(["127.0.0.1"], tmp_path / "trusted")
    other_cert, _ = make_self_signed(["127.0.0.1"], tmp_path / "other")
    for authorities, expected in ((trusted_cert, "hello"), (other_cert, "untrusted")):
        env = {**os.environ, "SSL_CERT_FILE": str(authorities), "SSL_CERT_DIR": str(tmp_path / "no-such-dir")}
        done = subprocess.run([sys.executable, "-c", TRUST_ON_FIRST_USE, str(trusted_cert), str(trusted_key)],
                              capture_output=True, text=True, cwd=REPO, timeout=120, env=env)
        assert done.stdout.strip() == expected, done.stderr
