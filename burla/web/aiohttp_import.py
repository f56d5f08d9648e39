"""Importing aiohttp without reading the system's certificate authorities at import.

aiohttp builds two default TLS contexts when it is imported, each reading the system's bundle
of certificate authorities: about 60 ms of CPU in every process that imports it, whether or not
it ever makes a TLS connection. Heads and nodes import it on every cold start and mostly speak
plain HTTP on loopback or pin a certificate. There those two contexts read the bundle when they
first start a TLS connection instead: the same trust, paid for only by a process that uses it.

Only for processes that run no user code: while aiohttp imports, every SSLContext this process
creates skips the bundle, so a user's thread making one then would be left without it. Heads
and nodes import it before they start threads.
"""

from __future__ import annotations

import ssl
import sys
import threading
from typing import Any


class _AuthoritiesOnFirstUse(ssl.SSLContext):
    """An SSLContext that loads the system's certificate authorities before its first connection."""

    def _load_authorities(self) -> None:
        if not self.__dict__.get("_burla_authorities_loaded"):
            self.__dict__["_burla_authorities_loaded"] = True
            super().set_default_verify_paths()

    def wrap_bio(self, *args: Any, **kwargs: Any) -> Any:  # how asyncio starts TLS
        self._load_authorities()
        return super().wrap_bio(*args, **kwargs)

    def wrap_socket(self, *args: Any, **kwargs: Any) -> Any:
        self._load_authorities()
        return super().wrap_socket(*args, **kwargs)

    def get_ca_certs(self, *args: Any, **kwargs: Any) -> Any:
        self._load_authorities()
        return super().get_ca_certs(*args, **kwargs)

    def cert_store_stats(self) -> Any:
        self._load_authorities()
        return super().cert_store_stats()


def import_aiohttp() -> None:
    """Import aiohttp (if nothing has yet) with its default TLS contexts loading lazily; with
    other threads running, as usual (see above)."""
    if "aiohttp" in sys.modules:
        return
    if threading.active_count() != 1:
        import aiohttp  # noqa: F401
        return
    deferred: list[ssl.SSLContext] = []

    def defer(context: ssl.SSLContext) -> None:
        deferred.append(context)

    overridden = "set_default_verify_paths" in vars(ssl.SSLContext)
    original = ssl.SSLContext.set_default_verify_paths
    ssl.SSLContext.set_default_verify_paths = defer  # type: ignore[method-assign,assignment]
    try:
        import aiohttp  # noqa: F401
    finally:
        if overridden:
            ssl.SSLContext.set_default_verify_paths = original  # type: ignore[method-assign]
        else:
            del ssl.SSLContext.set_default_verify_paths
    for context in deferred:
        if type(context) is ssl.SSLContext:
            context.__class__ = _AuthoritiesOnFirstUse
        else:  # a subclass this can't stand in for: load now, as aiohttp would have
            original(context)
