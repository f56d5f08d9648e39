"""A head proving it holds the cluster token before a client sends it anything secret.

A client that finds a head on this machine (the one its config directory records, or a loopback
URL it was given) asks `/health?nonce=N` with a fresh random nonce; the head answers with an
HMAC of that nonce under a key derived from the cluster token, which the client checks with its
own copy. Whatever else holds the port (another user's head, any server) can't answer, so the
token, job tokens and inputs go only to a head that already has the token. The key is its own
derivation ("burla head proof"), apart from those of scoped tokens and login links, so the
answers, to nonces anyone may choose, help make none of those. A client holding a scoped token
(a call's job token) shows its public part (`scope=`, the kind and the job's id) and the head
proves it could make that token.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from burla.web import scoped_tokens

NONCE_BYTES = 16
MAX_NONCE_HEX = 128


def new_nonce() -> str:
    return secrets.token_hex(NONCE_BYTES)


def proof(cluster_token: str, nonce: str) -> str:
    key = hmac.new(cluster_token.encode(), b"burla head proof", hashlib.sha256).digest()
    return hmac.new(key, nonce.encode(), hashlib.sha256).hexdigest()


def proves(cluster_token: str, nonce: str, answer: object) -> bool:
    return isinstance(answer, str) and hmac.compare_digest(proof(cluster_token, nonce).encode(),
                                                            answer.encode("utf-8", "surrogatepass"))


def head_answer(cluster_token: str, nonce: str, scope: str | None) -> str | None:
    """The head's proof for a holder of the cluster token (`scope` None) or of the scoped token
    `scope` names; None if it names none."""
    if scope is None:
        return proof(cluster_token, nonce)
    token = scoped_tokens.rebuilt(cluster_token, scope)
    return None if token is None else proof(token, nonce)


def challenge_query(token: str, nonce: str) -> str:
    """The query a holder of `token` sends: its nonce, and a scoped token's public part."""
    scope = scoped_tokens.public_part(token) if scoped_tokens.is_scoped(token) else None
    return f"nonce={nonce}" + (f"&scope={scope}" if scope else "")
