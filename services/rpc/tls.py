"""TLS for Frenzy's gRPC servers and clients: which files, read once, turned into credentials.

Servers take ``--tls-cert/--tls-key`` (serve TLS) and ``--tls-ca`` (also require a client
certificate signed by that CA: mutual TLS). Clients trust the CA in ``FRENZY_TLS_CA`` (or the
credentials file's ``ca``) and present ``FRENZY_TLS_CERT``/``FRENZY_TLS_KEY`` when a server
wants a client certificate. With no CA configured a client speaks plaintext, which is what
the loopback dev stack does; bearer tokens ride either way (grpc's own call credentials
insist on TLS, which is why the token is added by an interceptor: see ``rpc.auth``).

Errors name the option and the file, never the file's content.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import grpc


class TlsConfigError(ValueError):
    """A TLS option is incomplete or a file cannot be read."""


def _read(path: str | os.PathLike[str], option: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise TlsConfigError(f"{option}: cannot read {path} ({exc.strerror})") from None
    if b"-----BEGIN" not in data:
        raise TlsConfigError(f"{option}: {path} is not a PEM file")
    return data


@dataclass(frozen=True)
class ServerTls:
    """A server's certificate chain and key, and (for mutual TLS) the CA its clients must chain to."""

    cert: bytes
    key: bytes
    client_ca: bytes | None = None

    @classmethod
    def from_files(cls, cert: str | None, key: str | None, ca: str | None = None) -> ServerTls | None:
        """None when no option is given; an error naming what is missing when only some are."""
        if not cert and not key:
            if ca:
                raise TlsConfigError("--tls-ca needs --tls-cert and --tls-key (a server without TLS cannot "
                                     "check client certificates)")
            return None
        if not cert or not key:
            raise TlsConfigError("--tls-cert and --tls-key go together")
        return cls(_read(cert, "--tls-cert"), _read(key, "--tls-key"), _read(ca, "--tls-ca") if ca else None)

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials([(self.key, self.cert)], root_certificates=self.client_ca,
                                           require_client_auth=self.client_ca is not None)


@dataclass(frozen=True)
class ClientTls:
    """What a client trusts (the CA) and, for mutual TLS, the certificate it presents."""

    ca: bytes
    cert: bytes | None = None
    key: bytes | None = None

    @classmethod
    def from_files(cls, ca: str | None, cert: str | None = None, key: str | None = None) -> ClientTls | None:
        if not ca:
            if cert or key:
                raise TlsConfigError("FRENZY_TLS_CERT/FRENZY_TLS_KEY need FRENZY_TLS_CA (the CA to trust)")
            return None
        if bool(cert) != bool(key):
            raise TlsConfigError("FRENZY_TLS_CERT and FRENZY_TLS_KEY go together")
        return cls(_read(ca, "FRENZY_TLS_CA"), _read(cert, "FRENZY_TLS_CERT") if cert else None,
                   _read(key, "FRENZY_TLS_KEY") if key else None)

    @classmethod
    def from_env(cls, ca_fallback: str | None = None) -> ClientTls | None:
        return cls.from_files(os.environ.get("FRENZY_TLS_CA") or ca_fallback, os.environ.get("FRENZY_TLS_CERT"),
                              os.environ.get("FRENZY_TLS_KEY"))

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=self.ca, private_key=self.key,
                                            certificate_chain=self.cert)


def open_channel(address: str, tls: ClientTls | None) -> grpc.Channel:
    """A channel to ``address``: TLS when ``tls`` is given, else plaintext."""
    if tls is None:
        return grpc.insecure_channel(address)
    return grpc.secure_channel(address, tls.credentials())
