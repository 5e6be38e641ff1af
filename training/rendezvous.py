"""torchrun's c10d rendezvous with its state signed by the job's secret: ``gpulab``.

torch's ``c10d`` backend keeps the rendezvous state pickled in a TCPStore under
``torch.rendezvous.<run id>``, and every agent calls ``pickle.loads`` on what it
reads there at each heartbeat. A TCPStore takes any TCP client, so anyone who can
reach the port could write a pickle there and run code as the job's owner. Here
every state an agent writes carries an HMAC-SHA256 under a secret only the job's
own ranks know (:func:`load_secret`), and a value whose MAC does not verify is
never unpickled.

Such a value is *ignored*, not fatal, so junk cannot stop an honest job: the
agent keeps the last state it could verify (or none), logs one warning naming
tampering, and its next write replaces the forged value (``compare_set`` against
it). An attacker without the secret can therefore neither run code, nor join the
rendezvous as a node, nor make the agents fail by writing junk. What it can still
do (see the docs' security pages): read the state (node addresses and pids),
write back an older state it read (a replay: the agents may restart their
workers, a denial of service), and overwrite the store's other keys, which the
agents also sign (:class:`SignedStore`: a forged ``MASTER_ADDR`` stops the job
with an error instead of sending its workers elsewhere) or count (a forged
count stalls a barrier). All of it a denial of service; no code runs from it.

The store itself listens on the address the rendezvous endpoint names (the
node's own), not on every interface, where that address is one of this host's.

Registered by :mod:`gpulab.training.launch` (``--rdzv-backend=gpulab``).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import os
import socket
import stat
from base64 import b64decode, b64encode
from datetime import timedelta

from torch.distributed import Store, TCPStore
from torch.distributed.elastic.rendezvous import (
    RendezvousConnectionError,
    RendezvousError,
    RendezvousParameters,
)
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    RendezvousBackend,
    create_handler,
)
from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

from . import env as rank_env

log = logging.getLogger(__name__)

#: The name torchrun knows this backend by (``--rdzv-backend=gpulab``).
NAME = "gpulab"
DEFAULT_PORT = 29400
#: What a signed value starts with: a version, so the format can change.
MAGIC = b"gpulab-rdzv-v1\n"
MAC_BYTES = hashlib.sha256().digest_size
#: The shortest secret accepted (bytes of its text): 128 bits as hex.
MIN_SECRET = 32
# Stands for "no state yet" (a store's get blocks until a key exists, so the key
# always holds something). Not valid base64 of a signed value.
_NONE = "gpulab:none"


def load_secret(environ: dict | None = None) -> bytes:
    """The job's secret: ``$GPULAB_RDZV_SECRET``, else the file ``$GPULAB_RDZV_SECRET_FILE``.

    A file others may read is refused: the secret is only worth what its mode is.
    """
    environ = os.environ if environ is None else environ
    value = environ.get(rank_env.RDZV_SECRET, "").strip()
    path = environ.get(rank_env.RDZV_SECRET_FILE, "")
    if not value and path:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as e:
            raise RendezvousError(
                f"cannot read the job's rendezvous secret {path}: {e.strerror}; "
                "resubmit the job (the service writes it at submit)"
            ) from None
        with os.fdopen(fd, "rb") as f:
            if stat.S_IMODE(os.fstat(f.fileno()).st_mode) & 0o004:
                raise RendezvousError(
                    f"the rendezvous secret {path} is readable by every user: chmod o-r it"
                )
            value = f.read(4096).decode(errors="replace").strip()
    if not value:
        raise RendezvousError(
            f"no rendezvous secret: set {rank_env.RDZV_SECRET} or "
            f"{rank_env.RDZV_SECRET_FILE} (gpulab's backends do)"
        )
    if len(value) < MIN_SECRET:
        raise RendezvousError(
            f"the rendezvous secret is {len(value)} characters; use at least {MIN_SECRET} "
            "(python -c 'import secrets; print(secrets.token_hex(32))')"
        )
    return value.encode()


def seal(secret: bytes, key: str, state: bytes) -> bytes:
    """``state`` signed for the store key ``key`` (a state cannot be moved to another job)."""
    mac = hmac.new(secret, key.encode() + b"\0" + state, hashlib.sha256).digest()
    return MAGIC + mac + state


def unseal(secret: bytes, key: str, sealed: bytes) -> bytes | None:
    """The state inside ``sealed``, or None if its MAC does not verify."""
    if not sealed.startswith(MAGIC) or len(sealed) < len(MAGIC) + MAC_BYTES:
        return None
    mac = sealed[len(MAGIC) : len(MAGIC) + MAC_BYTES]
    state = sealed[len(MAGIC) + MAC_BYTES :]
    good = hmac.new(secret, key.encode() + b"\0" + state, hashlib.sha256).digest()
    return state if hmac.compare_digest(mac, good) else None


class SignedC10dBackend(RendezvousBackend):
    """The c10d backend's protocol (base64 in a store, ``compare_set``), every value signed.

    Tokens are the raw store values, as torch's: an agent writes only over the
    value it last read, so a forged value it read is what its next write replaces.
    """

    def __init__(self, store: Store, run_id: str, secret: bytes) -> None:
        if not run_id:
            raise ValueError("The run id must be a non-empty string.")
        self._store = store
        self._secret = secret
        # The key torch's c10d backend uses: a forged value written for torch is
        # exactly what this backend reads (and refuses).
        self._key = "torch.rendezvous." + run_id
        self._last: bytes | None = None  # the last state that verified
        self._forged: bytes | None = None  # a forged value read while no state verified yet
        self._warned: set[bytes] = set()
        self._call("compare_set", self._key, "", _NONE)

    @property
    def name(self) -> str:
        return NAME

    def get_state(self):
        return self._decode(self._call("get", self._key))

    def set_state(self, state: bytes, token=None):
        if token is not None and not isinstance(token, bytes):
            found = self.get_state()
            return (*found, False) if found is not None else None
        expected = token or self._forged or _NONE.encode()
        new = b64encode(seal(self._secret, self._key, state))
        raw = self._call("compare_set", self._key, expected.decode(), new.decode())
        found = self._decode(raw)
        if found is None:
            return None
        return found[0], found[1], raw == new

    def _call(self, op: str, *args):
        try:
            return getattr(self._store, op)(*args)
        except (ValueError, RuntimeError, TimeoutError) as exc:
            raise RendezvousConnectionError(
                "The connection to the C10d store has failed. See inner exception for details."
            ) from exc

    def _decode(self, raw: bytes):
        if raw == _NONE.encode():
            self._forged = None
            return None
        try:
            state = unseal(self._secret, self._key, b64decode(raw, validate=True))
        except ValueError:  # not base64
            state = None
        if state is not None:
            self._last, self._forged = state, None
            return state, raw
        self._warn(raw)
        if self._last is not None:
            return self._last, raw
        self._forged = raw
        return None

    def _warn(self, raw: bytes) -> None:
        digest = hashlib.sha256(raw).digest()
        if digest in self._warned:
            return
        self._warned.add(digest)
        log.warning(
            "gpulab: ignored a rendezvous state in %s that is not signed with this job's "
            "secret (%d bytes): written by a process outside the job (tampering?); "
            "it was not unpickled, and the job goes on",
            self._key,
            len(raw),
        )


class SignedStore(Store):
    """The rendezvous store as the agents use it beyond the state, every value signed.

    torch's agents keep more in the rendezvous store than the state: the workers'
    ``MASTER_ADDR`` and ``MASTER_PORT`` (where every worker connects its process
    group), each agent's role and its ranks. An attacker who rewrote
    ``MASTER_ADDR`` would have the workers connect to a store of its own. Here every
    value set is signed, and a value read that does not verify stops the agent with
    an error naming tampering (the honest value is gone; nothing forged is used).
    Counters (``add``) cannot be signed: a forged count can only stall a barrier.
    """

    def __init__(self, store: Store, secret: bytes) -> None:
        super().__init__()
        self._store = store
        self._secret = secret
        self.set_timeout(store.timeout)

    def _seal(self, key: str, value) -> bytes:
        data = value.encode() if isinstance(value, str) else bytes(value)
        return seal(self._secret, key, data)

    def _open(self, key: str, sealed: bytes) -> bytes:
        value = unseal(self._secret, key, bytes(sealed))
        if value is None:
            raise RendezvousError(
                f"gpulab: the rendezvous store's {key!r} is not signed with this job's "
                "secret: written by a process outside the job (tampering?); not used"
            )
        return value

    def set(self, key, value):
        self._store.set(key, self._seal(key, value))

    def get(self, key):
        return self._open(key, self._store.get(key))

    def multi_set(self, keys, values):
        self._store.multi_set(keys, [self._seal(k, v) for k, v in zip(keys, values, strict=True)])

    def multi_get(self, keys):
        return [self._open(k, v) for k, v in zip(keys, self._store.multi_get(keys), strict=True)]

    def compare_set(self, key, expected, desired):
        # Signing is deterministic, so a signed expected value equals the stored one.
        old = self._seal(key, expected) if expected else ""
        return self._open(key, self._store.compare_set(key, old, self._seal(key, desired)))

    def add(self, key, amount):
        return self._store.add(key, amount)

    def wait(self, keys, timeout=None):
        self._store.wait(keys, self.timeout if timeout is None else timeout)

    def check(self, keys):
        return self._store.check(keys)

    def delete_key(self, key):
        return self._store.delete_key(key)

    def num_keys(self):
        return self._store.num_keys()


def listening_socket(host: str, port: int) -> socket.socket | None:
    """A socket listening on ``host``'s address (one of this machine's), or None if it is not.

    None too for a host *name* that resolves to a loopback address (Debian's
    ``127.0.1.1 <hostname>``): the other nodes reach that name elsewhere.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return None
    for family, kind, proto, _, addr in infos:
        if (
            ipaddress.ip_address(addr[0]).is_loopback
            and not _is_address(host)
            and host != "localhost"
        ):
            return None
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
            sock.listen(socket.SOMAXCONN)
            return sock
        except OSError:
            sock.close()
    return None


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def create_store(params: RendezvousParameters) -> TCPStore:
    """The rendezvous TCPStore: hosted on ``is_host=1`` (bound to the endpoint's address)."""
    host, port = parse_rendezvous_endpoint(params.endpoint, default_port=DEFAULT_PORT)
    is_host = params.get_as_bool("is_host")
    if is_host is None:
        raise RendezvousError("--rdzv-conf must say is_host=1 on the node that hosts the store")
    timeout = timedelta(seconds=params.get_as_int("read_timeout", 60) or 60)
    fd = None
    if is_host:
        sock = listening_socket(host, port)
        if sock is None:
            # The endpoint is not an address of this host (or a name this host
            # resolves to loopback): every interface, as torch does; the MAC holds.
            log.warning(
                "gpulab: %s is not an address of this host that other nodes reach; the "
                "rendezvous store listens on every interface",
                host,
            )
        else:
            fd = sock.detach()  # the store owns the listening socket from now on
    try:
        if fd is None:
            return TCPStore(host, port, is_master=is_host, multi_tenant=True, timeout=timeout)
        return TCPStore(host, port, is_master=True, timeout=timeout, master_listen_fd=fd)
    except (ValueError, RuntimeError, TimeoutError) as exc:
        raise RendezvousConnectionError(
            f"The connection to the rendezvous store at {host}:{port} has failed: {exc}"
        ) from exc


def create_rdzv_handler(params: RendezvousParameters):
    """What torchrun calls for ``--rdzv-backend=gpulab``."""
    secret = load_secret()
    store = create_store(params)
    backend = SignedC10dBackend(store, params.run_id, secret)
    return create_handler(SignedStore(store, secret), backend, params)


def register() -> None:
    """Make ``--rdzv-backend=gpulab`` known to torchrun in this process."""
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    rendezvous_handler_registry.register(NAME, create_rdzv_handler)
