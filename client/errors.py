"""What the gpulab client raises: one base class, a subclass per kind of trouble.

Every error is a :class:`GpuLabError` with ``status`` (the HTTP status, 0 when
no answer came) and ``str()`` the message to show::

    GpuLabError
    ├── ConfigurationError   status 0: no API address or no token
    ├── ServiceUnreachable   status 0: no answer (refused, timed out, cut off)
    └── RequestRefused       status >= 400: the service answered with an error
        ├── BadRequest           400: the input was wrong; the message says how
        ├── AuthenticationError  401: no valid token
        ├── PermissionDenied     403: not yours, or not allowed
        ├── NotFound             404
        └── Conflict             409: the name is taken, or the state forbids it

Magics turn ``ConfigurationError``, ``ServiceUnreachable`` and ``BadRequest`` into
usage errors (what to change), the other refusals into their own exceptions.
"""

from __future__ import annotations


class GpuLabError(Exception):
    """Anything the client raises; ``str()`` is the message, ``status`` the HTTP code (or 0)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status

    @property
    def message(self) -> str:
        return str(self)

    def __reduce__(self):
        return type(self), (self.status, str(self))


class ConfigurationError(GpuLabError):
    """The client cannot be built: no API address or no token (``status`` 0)."""


class ServiceUnreachable(GpuLabError):
    """No answer from the service: connection refused, timed out or cut off (``status`` 0)."""


class RequestRefused(GpuLabError):
    """The service answered with an error status (>= 400); its ``{"error"}`` is the message."""


class BadRequest(RequestRefused):
    """400: the request's input was wrong; the message says what to change."""


class AuthenticationError(RequestRefused):
    """401: the token is missing, wrong or expired."""


class PermissionDenied(RequestRefused):
    """403: the thing is someone else's, or the action is not allowed to you."""


class NotFound(RequestRefused):
    """404: no such job, deployment or route."""


class Conflict(RequestRefused):
    """409: the name is taken, or the thing's state forbids the action now."""


_BY_STATUS: dict[int, type[RequestRefused]] = {
    400: BadRequest,
    401: AuthenticationError,
    403: PermissionDenied,
    404: NotFound,
    409: Conflict,
}


def refused(status: int, message: str) -> RequestRefused:
    """The exception for an error answer: the status's own class, else :class:`RequestRefused`."""
    return _BY_STATUS.get(status, RequestRefused)(status, message)


__all__ = [
    "AuthenticationError",
    "BadRequest",
    "ConfigurationError",
    "Conflict",
    "GpuLabError",
    "NotFound",
    "PermissionDenied",
    "RequestRefused",
    "ServiceUnreachable",
    "refused",
]
