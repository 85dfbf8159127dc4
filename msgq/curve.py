"""Optional authentication and encryption of the project's remote channels
with ZeroMQ's CURVE mechanism (pyzmq's ``zmq.auth``): BroadcastQueue remote
readers, the zmq backend and ``msgq-bridge``. Off by default.

A keys directory holds::

    DIR/server.key, DIR/server.key_secret   the publishing side's key pair
    DIR/client.key, DIR/client.key_secret   the subscribing side's key pair
    DIR/authorized/*.key                    client public keys the server admits

``python -m msgq.curve DIR`` (or :func:`create_keys`) makes one with a server
pair, a client pair and that client authorized. The publishing side (a
BroadcastQueue writer, a zmq-backend publisher, ``msgq-bridge out``) needs
``server.key_secret`` and ``authorized/``; the subscribing side needs
``client.key_secret`` and ``server.key``. A client whose public key is not
in ``authorized/`` (or that does not speak CURVE) completes no handshake and
receives nothing; everything that flows is encrypted.

The server side starts one authenticator thread (``zmq.auth``'s ZAP handler)
per ZeroMQ context, for the life of the process.
"""

import atexit
import os
import shutil
import sys
import threading
import types
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Set, Tuple, Union

from msgq.errors import InvalidArgumentError

if TYPE_CHECKING:
    import zmq  # optional (pip install 'visionipc[zmq]'): imported where used

_Dir = Union[str, "os.PathLike[str]"]  # a keys directory

SERVER, CLIENT, AUTHORIZED = "server", "client", "authorized"

_lock = threading.Lock()
_authenticators: Dict[
    Tuple[int, int], Tuple[Any, Any, Set[str]]
] = {}  # (pid, id(context)) -> (context, authenticator, configured domains)


def _zmq() -> types.ModuleType:
    try:
        import zmq
        import zmq.auth
        import zmq.auth.thread
    except ImportError as e:
        raise ImportError("CURVE needs pyzmq: pip install 'visionipc[zmq]'") from e
    if not zmq.has("curve"):
        raise InvalidArgumentError("this libzmq was built without CURVE support (libsodium)")
    return zmq


def create_keys(directory: str) -> str:
    """Make a keys directory (owner-only): a server pair, a client pair, the
    client authorized. Returns the directory."""
    zmq = _zmq()
    os.makedirs(os.path.join(directory, AUTHORIZED), mode=0o700, exist_ok=True)
    os.chmod(directory, 0o700)
    for name in (SERVER, CLIENT):
        _, secret = zmq.auth.create_certificates(directory, name)
        os.chmod(secret, 0o600)
    shutil.copy(os.path.join(directory, CLIENT + ".key"), os.path.join(directory, AUTHORIZED, CLIENT + ".key"))
    return directory


def _load(directory: _Dir, name: str, secret: bool) -> Tuple[bytes, Optional[bytes]]:
    zmq = _zmq()
    path = os.path.join(str(directory), name + (".key_secret" if secret else ".key"))
    try:
        public, secret_key = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as e:
        raise InvalidArgumentError(f"CURVE keys directory {directory}: cannot load {path}: {e}") from None
    if secret and secret_key is None:
        raise InvalidArgumentError(f"CURVE keys directory {directory}: {path} holds no secret key")
    return public, secret_key


def _keypair(directory: _Dir, name: str) -> Tuple[bytes, bytes]:
    public, secret = _load(directory, name, True)
    assert secret is not None  # _load raised if the file holds none
    return public, secret


def server_public_key(directory: _Dir) -> bytes:
    """The server's public key (z85), for clients that are not given the directory's ``server.key``."""
    return _load(directory, SERVER, False)[0]


def _authenticator(ctx: "zmq.Context[Any]", domain: str, authorized: str) -> None:
    zmq = _zmq()
    key = (os.getpid(), id(ctx))
    with _lock:
        entry = _authenticators.get(key)
        if entry is None or entry[0] is not ctx:
            auth = zmq.auth.thread.ThreadAuthenticator(ctx)
            auth.start()
            entry = _authenticators[key] = (ctx, auth, set())
        if domain not in entry[2]:
            entry[1].configure_curve(domain=domain, location=authorized)
            entry[2].add(domain)


def stop_authenticator(ctx: "zmq.Context[Any]") -> None:
    """Stop the authenticator thread of ``ctx`` (before destroying a context of one's own)."""
    with _lock:
        entry = _authenticators.pop((os.getpid(), id(ctx)), None)
    if entry is not None:
        try:
            entry[1].stop()
        except Exception:  # the context is terminated already: the thread has ended with it
            pass


@atexit.register
def _stop_all() -> None:
    # Only this process's: a forked child must not touch its parent's threads' sockets.
    for (pid, _), (ctx, _, _) in list(_authenticators.items()):
        if pid == os.getpid():
            stop_authenticator(ctx)


def check_server_dir(directory: _Dir) -> None:
    """InvalidArgumentError unless DIR holds what a server needs."""
    _load(directory, SERVER, True)
    if not os.path.isdir(os.path.join(str(directory), AUTHORIZED)):
        raise InvalidArgumentError(f"CURVE keys directory {directory} has no {AUTHORIZED}/ of client public keys")


def check_client_dir(directory: _Dir) -> None:
    """InvalidArgumentError unless DIR holds what a client needs."""
    _load(directory, CLIENT, True)
    server_public_key(directory)


def make_server(sock: "zmq.Socket[Any]", directory: _Dir) -> None:
    """Make ``sock`` (not yet bound) a CURVE server with DIR's server keys,
    admitting only the clients in DIR/authorized."""
    directory = os.path.abspath(str(directory))
    check_server_dir(directory)
    public, secret = _keypair(directory, SERVER)
    authorized = os.path.join(directory, AUTHORIZED)
    zmq = _zmq()
    _authenticator(sock.context, directory, authorized)
    sock.setsockopt(zmq.ZAP_DOMAIN, directory.encode())
    sock.setsockopt(zmq.CURVE_SECRETKEY, secret)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
    sock.setsockopt(zmq.CURVE_SERVER, 1)


def make_client(sock: "zmq.Socket[Any]", directory: _Dir, server_key: Union[str, bytes, None] = None) -> None:
    """Make ``sock`` (not yet connected) a CURVE client with DIR's client keys,
    trusting the server key ``server_key`` (default: DIR/server.key)."""
    public, secret = _keypair(directory, CLIENT)
    if server_key is None:
        server_key = server_public_key(directory)
    zmq = _zmq()
    sock.setsockopt(zmq.CURVE_SECRETKEY, secret)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
    sock.setsockopt(zmq.CURVE_SERVERKEY, server_key if isinstance(server_key, bytes) else server_key.encode())


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        sys.stderr.write("usage: python -m msgq.curve DIR   (creates a CURVE keys directory)\n")
        return 2
    print(create_keys(args[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
