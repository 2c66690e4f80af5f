"""``frenzy certs create``: a private CA and certificates for Frenzy's TLS, with nothing else installed.

For tests, compose and small clusters; a site with its own PKI uses its own certificates
(any PEM files work with ``--tls-cert/--tls-key/--tls-ca``). Keys are EC P-256, written
0600; certificates last ``--days`` (default 397, the longest browsers accept for a server
certificate). The server certificate names every ``--host`` (DNS names and IP addresses) in
its subjectAltName, which is what TLS clients check; a client certificate (``client.pem``)
is made for mutual TLS.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from frenzy.cli import render
from frenzy.cli.output import fail

if TYPE_CHECKING:  # annotations only; imported where the command runs
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec

certs_app = typer.Typer(help="TLS certificates for the scheduler, predictor and API.", no_args_is_help=True)


def _key() -> ec.EllipticCurvePrivateKey:
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _write(path: Path, data: bytes, private: bool) -> None:
    from frenzy.auth.credentials import write_private

    write_private(path, data, 0o600 if private else 0o644)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _san(hosts: list[str]) -> x509.SubjectAlternativeName:
    from cryptography import x509

    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def _issue(subject: str, key: ec.EllipticCurvePrivateKey, ca_key: ec.EllipticCurvePrivateKey,
           ca_name: x509.Name, days: int, *, ca: bool = False, hosts: list[str] | None = None,
           client: bool = False) -> x509.Certificate:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (x509.CertificateBuilder().subject_name(name).issuer_name(name if ca else ca_name)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False, encipher_only=False,
            decipher_only=False), critical=True)
    else:
        builder = builder.add_extension(x509.ExtendedKeyUsage(
            [ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    if hosts:
        builder = builder.add_extension(_san(hosts), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


def make_certs(directory: Path, hosts: list[str], days: int = 397) -> dict[str, Path]:
    """CA, server and client certificates and keys in ``directory`` -> their paths by role."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    directory.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca_cert = _issue("Frenzy CA", ca_key, ca_key, x509.Name([]), days, ca=True)
    out: dict[str, Path] = {}
    _write(directory / "ca.pem", ca_cert.public_bytes(serialization.Encoding.PEM), private=False)
    _write(directory / "ca-key.pem", _pem_key(ca_key), private=True)
    out["ca"], out["ca_key"] = directory / "ca.pem", directory / "ca-key.pem"
    for role, client in (("server", False), ("client", True)):
        key = _key()
        cert = _issue(f"frenzy-{role}", key, ca_key, ca_cert.subject, days, hosts=None if client else hosts,
                      client=client)
        _write(directory / f"{role}.pem", cert.public_bytes(serialization.Encoding.PEM), private=False)
        _write(directory / f"{role}-key.pem", _pem_key(key), private=True)
        out[role], out[f"{role}_key"] = directory / f"{role}.pem", directory / f"{role}-key.pem"
    return out


@certs_app.command("create")
def create(
    directory: Annotated[Path, typer.Option("--dir", help="Where the PEM files go.")] = Path("certs"),
    host: Annotated[list[str] | None, typer.Option(
        "--host", help="A name or IP the servers answer on (repeat). Default: localhost, 127.0.0.1, ::1.")] = None,
    days: Annotated[int, typer.Option(min=1, max=3650, help="Validity in days.")] = 397,
    force: Annotated[bool, typer.Option(help="Replace certificates already in --dir.")] = False,
) -> None:
    """Make a CA, a server certificate for --host names and a client certificate (mutual TLS).

    \b
    Examples:
      frenzy certs create --dir certs --host sched.example.org --host 10.0.0.5
      frenzy scheduler --tls-cert certs/server.pem --tls-key certs/server-key.pem   # TLS
      frenzy scheduler ... --tls-ca certs/ca.pem                                     # + client certificates
      FRENZY_TLS_CA=certs/ca.pem frenzy jobs --scheduler sched.example.org:50051
    """
    if (directory / "ca.pem").exists() and not force:
        fail(f"{directory}/ca.pem exists. To fix: pass --force to replace it, or another --dir", 2)
    hosts = host or ["localhost", "127.0.0.1", "::1"]
    try:
        paths = make_certs(directory, hosts, days)
    except OSError as exc:
        fail(f"--dir: cannot write {directory} ({exc.strerror})", 1)
    con = render.console()
    con.print(f"CA, server ({', '.join(render.user_text(h) for h in hosts)}) and client certificates in "
              f"{render.user_text(directory)} (keys 0600):")
    for role, path in paths.items():
        con.print(f"  {role:<11} {render.user_text(path)}")


PANEL = "Operate a cluster"


def register(app: typer.Typer) -> None:
    app.add_typer(certs_app, name="certs", rich_help_panel=PANEL)
