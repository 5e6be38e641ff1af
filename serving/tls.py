"""The model server's certificate: loaded at start, and loaded again when it is renewed.

``--ssl-certfile``/``--ssl-keyfile`` name PEM files. On Kubernetes they come from a
Secret that cert-manager renews before the certificate expires; the kubelet swaps
the mounted files in place, but a server that read them once would keep showing
the old certificate until it expired. :class:`ServerCertificate` checks the files
every ``reload_s`` seconds and loads a changed pair into the same ``SSLContext``:
connections made after that get the new certificate, open ones keep theirs. A pair
that does not load (the certificate written, its key not yet) is retried at the
next check, the old one serving meanwhile.
"""

from __future__ import annotations

import os
import ssl
import sys

#: How often the certificate files are checked for a renewal (``--ssl-reload-seconds``).
RELOAD_S = 60.0


def tls_context(certfile: str | None, keyfile: str | None) -> ssl.SSLContext | None:
    """The server's TLS context of ``--ssl-certfile``/``--ssl-keyfile``; None for neither.
    ValueError, with the fix, for one without the other or files that do not load."""
    if not certfile and not keyfile:
        return None
    if not certfile or not keyfile:
        given, missing = (
            ("--ssl-certfile", "--ssl-keyfile") if certfile else ("--ssl-keyfile", "--ssl-certfile")
        )
        raise ValueError(f"{given} needs {missing} too: give both files to serve https")
    for flag, path in (("--ssl-certfile", certfile), ("--ssl-keyfile", keyfile)):
        try:
            with open(path, "rb"):
                pass
        except OSError as exc:
            raise ValueError(f"{flag} {path}: cannot read it: {exc.strerror or exc}") from None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    _load(context, certfile, keyfile)
    return context


def _load(context: ssl.SSLContext, certfile: str, keyfile: str) -> None:
    try:
        context.load_cert_chain(certfile, keyfile)
    except ssl.SSLError as exc:
        raise ValueError(
            f"--ssl-certfile {certfile} with --ssl-keyfile {keyfile}: not a PEM certificate "
            f"and its matching private key ({exc.reason or exc})"
        ) from None


class ServerCertificate:
    """The context serving ``certfile``/``keyfile``, and :meth:`reload_if_changed`."""

    def __init__(self, context: ssl.SSLContext, certfile: str, keyfile: str):
        self.context = context
        self.certfile = certfile
        self.keyfile = keyfile
        self._seen = self._state()

    def _state(self) -> tuple:
        # Following the links: a Secret's files are links the kubelet points elsewhere.
        states = []
        for path in (self.certfile, self.keyfile):
            try:
                st = os.stat(path)
                states.append((st.st_ino, st.st_mtime_ns, st.st_size))
            except OSError:
                states.append(None)
        return tuple(states)

    def reload_if_changed(self) -> bool:
        """Load the files again if they changed since the last load; True if loaded."""
        state = self._state()
        if state == self._seen or None in state:
            return False
        try:
            _load(self.context, self.certfile, self.keyfile)
        except (ValueError, OSError) as exc:  # half-written: keep the old pair, try again
            print(f"gpulab-serving: certificate not reloaded yet: {exc}", file=sys.stderr)
            return False
        self._seen = state
        print(f"gpulab-serving: reloaded the certificate {self.certfile}", flush=True)
        return True
