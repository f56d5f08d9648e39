"""A loopback TCP proxy whose connections a test can cut and restore (a network outage)."""

from __future__ import annotations

import socket
import threading


class CuttableProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self._target = (target_host, target_port)
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._cut = False
        self._passing = threading.Event()  # cleared by hold(): new connections wait before going through
        self._passing.set()
        self.connections = 0
        self._stalled: set[socket.socket] = set()  # connections whose bytes go nowhere (stall())
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cut(self) -> None:
        """Drop every connection and refuse new ones until restore()."""
        with self._lock:
            self._cut = True
            for sock in self._open:
                _close(sock)
            self._open.clear()

    def restore(self) -> None:
        with self._lock:
            self._cut = False

    def stall(self) -> None:
        """The connections open now stay open but carry nothing more, either way (a peer that
        vanished without a word); new connections go through."""
        with self._lock:
            self._stalled.update(self._open)

    def hold(self) -> None:
        """New connections are accepted but go nowhere until release() (a head slow to answer)."""
        self._passing.clear()

    def release(self) -> None:
        self._passing.set()

    def close(self) -> None:
        self._closed = True
        self.cut()
        _close(self._listener)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        self._passing.wait()
        with self._lock:
            if self._cut:
                _close(client)
                return
            try:
                upstream = socket.create_connection(self._target)
            except OSError:
                _close(client)
                return
            self._open.update((client, upstream))
            self.connections += 1
        for source, sink in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                if source not in self._stalled:
                    sink.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                for sock in (source, sink):
                    self._open.discard(sock)
                    _close(sock)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
