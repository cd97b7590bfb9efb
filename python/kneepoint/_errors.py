"""kneepoint's exceptions: one class per kneepoint_client::ClientError variant,
plus the Python layer's own (model repository, labels, images).

The native module raises these by name (kneepoint-python's src/lib.rs maps
every ClientError variant); their fields (``if_id``, ``expected``, ...) are
attributes. Where a builtin exception means the same, the class derives
from it too, so ``except TimeoutError`` or ``except ValueError`` also work.
"""

from __future__ import annotations

import builtins
from typing import Any


class KneepointError(Exception):
    """Base of every kneepoint error. ``retryable``: whether sending the same
    input again, as a new request, may succeed (the Rust crate's
    ``ClientError::is_retryable``)."""

    retryable: bool = False

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        for name, value in fields.items():
            setattr(self, name, value)


class PlatformError(KneepointError):
    """The platform answered with an error status (docs/PROTOCOL.md);
    ``status`` is its name."""

    status: str = ""


class UnknownIfError(PlatformError):
    """UNKNOWN_IF: no inference function under ``if_id`` (raised locally,
    nothing sent, when a model repository is given and lacks it)."""

    status = "UNKNOWN_IF"
    if_id: int


class BadRequestError(PlatformError):
    """BAD_REQUEST: the input's size is not the model's."""

    status = "BAD_REQUEST"
    if_id: int


class IncompleteError(PlatformError):
    """INCOMPLETE: fragments were lost on the way to the platform."""

    status = "INCOMPLETE"
    retryable = True


class OverloadedError(PlatformError):
    """OVERLOADED: the platform shed the request; retrying later may work."""

    status = "OVERLOADED"
    retryable = True


class InternalError(PlatformError):
    """INTERNAL: the inference function failed on this request."""

    status = "INTERNAL"


class TimeoutError(KneepointError, builtins.TimeoutError):
    """No answer within the client's timeout (a late answer is dropped)."""

    retryable = True


class UnreachableError(KneepointError, ConnectionError):
    """Nothing listens on the platform's address (an ICMP port unreachable
    came back). Without ICMP an absent platform is a TimeoutError."""


class WrongSizeError(KneepointError, ValueError):
    """The input is not the model's input size; nothing was sent."""

    if_id: int
    expected: int
    got: int


class EmptyInputError(KneepointError, ValueError):
    """An empty input; a request carries at least one byte."""


class InputTooLargeError(KneepointError, ValueError):
    """The input does not fit one request (too many fragments)."""

    len: int
    payload: int


class UnknownRequestError(KneepointError, LookupError):
    """wait() for a request id that is not outstanding on this client."""

    request_id: int


class ConfigError(KneepointError, ValueError):
    """A client setting that cannot work (address, fragment payload)."""


class SocketError(KneepointError, OSError):
    """A socket error (binding, sending)."""


class ModelRepositoryError(KneepointError):
    """The model repository cannot be read (a bad config.toml, a missing
    labels file)."""


class NoLabelsError(KneepointError, LookupError):
    """The model has no labels (no ``labels`` in its config.toml)."""

    if_id: int


class NoModelError(KneepointError, LookupError):
    """An image (not raw bytes) for an if_id whose input size is unknown:
    no model repository, or a model that takes no images."""

    if_id: int


class ImageError(KneepointError, ValueError):
    """An image that cannot be decoded or used as a model input."""
