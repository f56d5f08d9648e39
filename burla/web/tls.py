"""TLS for heads that listen beyond loopback.

A head serves HTTPS with a certificate it is given, or one it makes for itself
(`--tls-self-signed`). Clients, nodes and the CLI trust a self-signed head by pinning: the head's
own certificate file (`BURLA_HEAD_CERT`) is the only authority they accept for it, so no other
certificate passes, whatever name it carries. Without a pinned certificate, https heads are
verified against the system's authorities as usual.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import ssl
import tempfile
from pathlib import Path
from typing import Any

from burla.config import ENV_HEAD_CERT, private_dir, write_private_file
from burla.errors import TlsSetupError

CERT_FILE = "head-cert.pem"
KEY_FILE = "head-key.pem"


def make_self_signed(names: list[str], directory: Path) -> tuple[Path, Path]:
    """A certificate for these host names / IP addresses and its key, written to `directory`
    (the key readable by its owner only). Reused if one for the same names exists."""
    from cryptography import x509

    cert_path, key_path = directory / CERT_FILE, directory / KEY_FILE
    if cert_path.exists() and key_path.exists():
        existing = x509.load_pem_x509_certificate(cert_path.read_bytes())
        try:
            san = existing.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            covered = {str(v) for v in san.get_values_for_type(x509.IPAddress)} | set(san.get_values_for_type(
                x509.DNSName))
        except x509.ExtensionNotFound:
            covered = set()
        if set(names) <= covered and existing.not_valid_after_utc > datetime.datetime.now(datetime.UTC):
            return cert_path, key_path
    cert_pem, key_pem = _new_certificate(names)
    private_dir(directory)
    write_private_file(key_path, key_pem.decode())
    cert_path.write_bytes(cert_pem)
    return cert_path, key_path


def _new_certificate(names: list[str]) -> tuple[bytes, bytes]:
    """A self-signed certificate for these host names / IP addresses, and its key (both PEM)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    alternatives: list[x509.GeneralName] = []
    for name in dict.fromkeys(names):
        try:
            alternatives.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alternatives.append(x509.DNSName(name))
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0] if names else "burla")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.SubjectAlternativeName(alternatives), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return certificate.public_bytes(serialization.Encoding.PEM), key_pem


def node_server_context(host: str) -> tuple[ssl.SSLContext, bytes]:
    """A TLS context for a node's own server with a certificate made for this run, and that
    certificate's SHA-256 digest, which the head hands to thieves to pin (nothing else trusts it)."""
    cert_pem, key_pem = _new_certificate([host])
    with tempfile.TemporaryDirectory() as directory:  # 0700; the key is loaded, then the files go
        cert_path, key_path = Path(directory) / "node-cert.pem", Path(directory) / "node-key.pem"
        cert_path.write_bytes(cert_pem)
        write_private_file(key_path, key_pem.decode())
        context = server_context(cert_path, key_path)
    return context, hashlib.sha256(ssl.PEM_cert_to_DER_cert(cert_pem.decode())).digest()


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as e:
        raise TlsSetupError(f"can't use the certificate {cert} with the key {key}: {e}") from None
    return context


def client_context(pinned_cert: str | None) -> ssl.SSLContext | None:
    """The context for talking to a head: its pinned certificate if given, else None (defaults)."""
    if not pinned_cert:
        return None
    # Not create_default_context(): with names unchecked, trusting the system's authorities too
    # would let any publicly signed certificate through. Only the pinned one may verify.
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        context.load_verify_locations(cafile=pinned_cert)
    except (OSError, ssl.SSLError) as e:
        raise TlsSetupError(f"can't read the head certificate {pinned_cert} ({ENV_HEAD_CERT}): {e}") from None
    context.check_hostname = False  # pinned: only this exact certificate verifies, under any name
    return context


def head_connector(pinned_cert: str | None) -> Any:
    """An aiohttp connector for talking to a head (pinning its certificate if given)."""
    import sys

    import aiohttp

    context = client_context(pinned_cert)
    # Before 3.12.7 asyncio can leak closed TLS transports whose shutdown was cut short when the
    # loop ends; aiohttp aborts them on close if asked (and deprecates asking where it's fixed).
    # No cap on connections: every running job holds one WebSocket for its whole life, and the
    # jobs of a process share this connector (aiohttp's default cap of 100 would stall the 101st).
    if sys.version_info < (3, 12, 7):
        return aiohttp.TCPConnector(ssl=context or True, limit=0, enable_cleanup_closed=True)
    return aiohttp.TCPConnector(ssl=context or True, limit=0)


def is_certificate_error(error: BaseException) -> bool:
    """Whether a connection failed because the head's certificate was not trusted."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in str(current):
            return True
        reason = getattr(current, "reason", None)
        current = reason if isinstance(reason, BaseException) else (current.__cause__ or current.__context__)
    return False


CERT_FIX = (f"set {ENV_HEAD_CERT} to the head's certificate file (`burla head serve --tls-self-signed` prints "
            "where it is)")
