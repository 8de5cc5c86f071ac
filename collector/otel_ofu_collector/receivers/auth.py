"""Bearer-token checks and TLS material for the receivers."""

from __future__ import annotations

import hmac
from pathlib import Path

import attrs


@attrs.frozen
class BearerAuth:
    """Accepts ``authorization: Bearer <token>`` (case-insensitive scheme), compared in constant time."""

    token: str

    def allows(self, header: str | None) -> bool:
        if not header:
            return False
        scheme, _, credential = header.strip().partition(" ")
        if scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(credential.strip().encode(), self.token.encode())


def bearer_auth(token: str | None = None, token_file: str | None = None) -> BearerAuth | None:
    """The configured token, from the option (or its variable) or a file; None when neither is given (auth off).

    A token that is given but empty or blank is a ValueError, never auth off: a secret mounted empty, or a variable
    set to spaces, would otherwise open the receivers to anyone without a word."""
    if token_file:
        token = Path(token_file).read_text(encoding="utf-8").strip()
        if not token:
            raise ValueError(f"--bearer-token-file {token_file} is empty: refusing to start with authentication off")
    if token is None:
        return None
    if not token.strip():
        raise ValueError(
            "the bearer token is empty (--bearer-token or its variable): refusing to start with authentication off"
        )
    return BearerAuth(token.strip())


@attrs.frozen
class TlsFiles:
    """Server certificate and key (PEM), and the CA that client certificates must chain to for mTLS."""

    cert: str
    key: str
    client_ca: str | None = None

    def read(self) -> tuple[bytes, bytes, bytes | None]:
        client_ca = Path(self.client_ca).read_bytes() if self.client_ca else None
        return Path(self.cert).read_bytes(), Path(self.key).read_bytes(), client_ca
