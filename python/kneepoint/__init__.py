"""kneepoint — a Python client of the kneepoint inference platform.

Classify a photo::

    import kneepoint
    client = kneepoint.Client("10.77.0.2:9000", models="models")
    for p in client.infer(10, "coffee.png"):
        print(p.class_id, p.label, round(p.score, 3))

Everything on the wire is the Rust client library's (kneepoint-client, via
the native module ``kneepoint._native``): UDP per docs/PROTOCOL.md,
fragmenting, request ids, matching answers, timeouts. So is the image
preprocessing (resize the shorter side, centre crop: the Rust crate's
``image::preprocess``), so a Python and a Rust client send the same bytes
for the same picture. This layer adds the model repository (input sizes,
labels), input conversion and Python types.

Threads: one :class:`Client` serves any number of threads; every blocking
call releases the GIL while it waits.

Retries: none by default (``Client(retries=N)`` for infer). A retry is always a *new* request with a new
request id (the platform answers a request id once and then ignores it
for a while, so re-sending under the same id would be met with silence);
``KneepointError.retryable`` says which errors a new attempt may cure
(timeouts, INCOMPLETE, OVERLOADED).
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Mapping, TypeAlias

import numpy as np

from . import _native
from ._errors import (
    BadRequestError,
    ConfigError,
    EmptyInputError,
    ImageError,
    IncompleteError,
    InputTooLargeError,
    InternalError,
    KneepointError,
    ModelRepositoryError,
    NoLabelsError,
    NoModelError,
    OverloadedError,
    PlatformError,
    SocketError,
    TimeoutError,
    UnknownIfError,
    UnknownRequestError,
    UnreachableError,
    WrongSizeError,
)

__all__ = [
    "Answer",
    "ImageLike",
    "BadRequestError",
    "Client",
    "ConfigError",
    "EmptyInputError",
    "ImageError",
    "IncompleteError",
    "InputTooLargeError",
    "InternalError",
    "KneepointError",
    "Model",
    "ModelRepositoryError",
    "NoLabelsError",
    "NoModelError",
    "OverloadedError",
    "PlatformError",
    "Prediction",
    "SocketError",
    "TimeoutError",
    "UnknownIfError",
    "UnknownRequestError",
    "UnreachableError",
    "WrongSizeError",
    "load_models",
    "preprocess",
]

# Shown as kneepoint.TimeoutError etc. in tracebacks (they live in _errors).
for _obj in list(globals().values()):
    if isinstance(_obj, type) and issubclass(_obj, KneepointError):
        _obj.__module__ = __name__

#: Input bytes per datagram unless told otherwise (kp-client's too).
DEFAULT_FRAGMENT_PAYLOAD: int = _native.DEFAULT_FRAGMENT_PAYLOAD
MAX_FRAGMENT_PAYLOAD: int = _native.MAX_FRAGMENT_PAYLOAD

if TYPE_CHECKING:
    from PIL.Image import Image as PILImage

#: What ``infer`` takes: raw bytes (any buffer of unsigned bytes), a numpy
#: uint8 array (H, W, 3), a PIL image, or the path of a PNG/JPEG file.
ImageLike: TypeAlias = "bytes | bytearray | memoryview | np.ndarray | str | os.PathLike[str] | PILImage"
#: What ``preprocess`` takes.
PictureLike: TypeAlias = "np.ndarray | str | os.PathLike[str] | PILImage"


#: One of an answer's top-k classes: ``class_id``, ``label`` (the class's
#: name from the model's labels, None without labels) and ``score`` (the
#: model's output at ``class_id``, a probability for models that end in a
#: softmax). Frozen; also a 3-tuple ``(class_id, label, score)`` as far as
#: indexing, unpacking, ``len`` and equality go. Made by the native module,
#: like :class:`Answer`: building them in Python cost ~30 µs per answer
#: with the interpreter's caches cold after a wait (docs/PERFORMANCE-JOURNAL.md).
Prediction = _native.Prediction

#: A status-OK answer with everything the platform says about it (frozen):
#: ``request_id``, ``if_id``, ``predictions`` (a list of :class:`Prediction`,
#: highest score first), ``batch_size`` (of the batch the request was
#: inferred in), ``platform_latency_us`` (the platform's time from the
#: request's first fragment to its answer) and ``rtt`` (seconds, as seen by
#: the client: from just before the first fragment was sent to the
#: answer's arrival).
Answer = _native.Answer


@dataclass(frozen=True)
class Model:
    """A model of the model repository (models/<name>/config.toml)."""

    name: str
    if_id: int
    #: "rgb_u8_hwc" (an image: height x width x 3 RGB u8) or "f32_nchw".
    input_format: str
    height: int
    width: int
    #: Bytes a request to this model carries.
    input_len: int
    #: Class names (line i of labels.txt = class i); None without labels.
    labels: tuple[str, ...] | None

    @property
    def takes_images(self) -> bool:
        """Whether requests carry an RGB u8 image (so images are resized)."""
        return self.input_format == "rgb_u8_hwc"


def load_models(path: str | os.PathLike[str]) -> dict[int, Model]:
    """The models of the model repository at ``path`` (every
    ``<name>/config.toml`` below it), by if_id."""
    root = Path(path)
    if not root.is_dir():
        raise ModelRepositoryError(f"{root}: not a directory")
    models: dict[int, Model] = {}
    for cfg in sorted(root.glob("*/config.toml")):
        model = _load_model(cfg)
        if model.if_id in models:
            raise ModelRepositoryError(
                f"{cfg}: if_id {model.if_id} is also {models[model.if_id].name}'s"
            )
        models[model.if_id] = model
    return models


def _load_model(cfg: Path) -> Model:
    try:
        with open(cfg, "rb") as f:
            doc = tomllib.load(f)
        name = str(doc["name"])
        if_id = int(doc["if_id"])
        inp = doc["input"]
        fmt = str(inp.get("format", "rgb_u8_hwc"))
        c, h, w = (int(x) for x in inp["shape"])
        labels_file = doc.get("labels")
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError, ValueError) as e:
        raise ModelRepositoryError(f"{cfg}: {e!r}") from e
    if not 1 <= if_id <= 65535 or min(c, h, w) < 1:
        raise ModelRepositoryError(f"{cfg}: if_id {if_id} or input shape {[c, h, w]} out of range")
    if fmt == "rgb_u8_hwc":
        input_len = h * w * 3
    elif fmt == "f32_nchw":
        input_len = c * h * w * 4
    else:
        raise ModelRepositoryError(f"{cfg}: unknown input format {fmt!r}")
    labels = None
    if labels_file is not None:
        try:
            text = (cfg.parent / str(labels_file)).read_text(encoding="utf-8")
        except OSError as e:
            raise ModelRepositoryError(f"{cfg}: labels: {e}") from e
        labels = tuple(text.splitlines())
    return Model(name, if_id, fmt, h, w, input_len, labels)


def _default_models() -> Path | None:
    env = os.environ.get("KP_MODELS")
    if env:
        return Path(env)
    return Path("models") if Path("models").is_dir() else None


def _is_pil(image: Any) -> bool:
    # Without importing PIL (an optional dependency).
    return any(c.__module__.startswith("PIL.") and c.__name__ == "Image" for c in type(image).__mro__)


def _rgb_array(image: Any) -> np.ndarray:
    """A PIL image or numpy array as a C-contiguous (H, W, 3) uint8 array."""
    if _is_pil(image):
        if image.mode != "RGB":
            # As the Rust crate's to_rgb8(): grey replicated, alpha dropped.
            image = image.convert("RGB")
        return np.asarray(image, dtype=np.uint8)
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8:
            raise ImageError(f"an image array must be uint8, not {image.dtype}")
        if image.ndim != 3 or image.shape[2] != 3:
            raise ImageError(f"an image array must be (height, width, 3), not {image.shape}")
        if image.shape[0] < 1 or image.shape[1] < 1:
            raise ImageError(f"an empty image: {image.shape}")
        return np.ascontiguousarray(image)
    raise ImageError(f"not an image: {type(image).__name__}")


def preprocess(image: PictureLike, height: int, width: int) -> np.ndarray:
    """``image`` (a numpy uint8 (H, W, 3) array, a PIL image, or the path of a
    PNG/JPEG file) as a ``height`` x ``width`` model input: a (height,
    width, 3) uint8 array, resized and centre-cropped by the Rust crate's
    ``image::preprocess`` (its docs give the exact arithmetic). Always
    resamples, even an image of the target size (resize to the short side
    first)."""
    if isinstance(image, (str, os.PathLike)):
        out = _native.load_image(os.fspath(image), height, width)
    else:
        rgb = _rgb_array(image)
        out = _native.preprocess_rgb(rgb, rgb.shape[0], rgb.shape[1], height, width)
    return np.frombuffer(out, dtype=np.uint8).reshape(height, width, 3)


class _Inputs:
    """What is sent for an input: :meth:`Client.input_for`. The native client
    takes raw buffers and arrays of the model's exact size itself, and calls
    this for every other input; it is its own object, not a method of
    :class:`Client`, so that the native client does not refer back to the
    Client that owns it (a cycle would keep the socket and its receiver
    thread alive until a garbage collection)."""

    def __init__(self, models: dict[int, Model] | None, repo: Path | None) -> None:
        self.models = models
        self.repo = repo

    def model(self, if_id: int) -> Model | None:
        if self.models is None:
            return None
        model = self.models.get(if_id)
        if model is None:
            raise UnknownIfError(
                f"if_id {if_id} is not in the model repository {self.repo} (nothing sent)",
                if_id=if_id,
            )
        return model

    def __call__(self, if_id: int, image: ImageLike) -> bytes | bytearray | memoryview | np.ndarray:
        model = self.model(if_id)
        if isinstance(image, (bytes, bytearray, memoryview)):
            return image
        if isinstance(image, np.ndarray):
            if image.dtype == np.uint8 and (
                model is None or not model.takes_images or image.shape == (model.height, model.width, 3)
            ):
                return image
        elif not isinstance(image, (str, os.PathLike)) and not _is_pil(image):
            raise TypeError(
                "an input is bytes, a numpy uint8 array, a PIL image or a path, "
                f"not {type(image).__name__}"
            )
        if model is None or not model.takes_images:
            why = "no model repository" if model is None else f"model {model.name} takes {model.input_format}"
            raise NoModelError(
                f"if_id {if_id}: an image needs the model's input size ({why}); send raw bytes",
                if_id=if_id,
            )
        if isinstance(image, (str, os.PathLike)):
            return _native.load_image(os.fspath(image), model.height, model.width)
        rgb = _rgb_array(image)
        if rgb.shape == (model.height, model.width, 3):
            return rgb
        return _native.preprocess_rgb(rgb, rgb.shape[0], rgb.shape[1], model.height, model.width)


class Client:
    """A connection to one kneepoint platform: one UDP socket and one receiver
    thread (the Rust ``kneepoint_client::Client``), shared by every thread
    that uses this object.

    ``addr``: the platform's IPv4 ``host:port``. ``timeout``: seconds a
    request waits for its answer. ``models``: the model repository (input
    sizes, labels; default ``$KP_MODELS``, else ``./models`` if it exists;
    ``False`` for none); with one, inputs of a wrong size are refused locally and if_ids it
    lacks raise :class:`UnknownIfError` without sending; without one, only
    raw inputs (bytes, uint8 arrays) are accepted, sent as they are, and
    labels are None. ``fragment_payload``: input bytes per datagram.
    ``retries``: how many times :meth:`infer` sends the input again, each
    time as a new request, after a retryable error (default 0: retrying an
    overloaded platform adds load); submit/poll users resubmit themselves."""

    def __init__(
        self,
        addr: str,
        *,
        timeout: float = 1.0,
        models: str | os.PathLike[str] | None | Literal[False] = None,
        fragment_payload: int = DEFAULT_FRAGMENT_PAYLOAD,
        retries: int = 0,
    ) -> None:
        repo = None if models is False else Path(models) if models is not None else _default_models()
        self._models: dict[int, Model] | None = load_models(repo) if repo is not None else None
        self._repo = repo
        self._inputs = _Inputs(self._models, repo)
        table = (
            None
            if self._models is None
            else [
                (
                    m.if_id,
                    m.input_len,
                    (m.height, m.width) if m.takes_images else None,
                    list(m.labels) if m.labels is not None else None,
                )
                for m in self._models.values()
            ]
        )
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        self._native = _native.NativeClient(
            addr, float(timeout), int(fragment_payload), int(retries), table, self._inputs, np.ndarray
        )

    @property
    def models(self) -> Mapping[int, Model] | None:
        """The model repository's models by if_id; None without one."""
        return self._models

    def model(self, if_id: int) -> Model | None:
        """``if_id``'s model; None without a repository. Raises
        :class:`UnknownIfError` if the repository lacks it."""
        return self._inputs.model(if_id)

    def labels(self, if_id: int) -> tuple[str, ...]:
        """``if_id``'s class names. Raises :class:`NoLabelsError` if the
        model has none (or there is no repository)."""
        model = self.model(if_id)
        if model is None or model.labels is None:
            why = "no model repository" if model is None else f"model {model.name} has no labels"
            raise NoLabelsError(f"if_id {if_id}: {why}", if_id=if_id)
        return model.labels

    def input_for(self, if_id: int, image: ImageLike) -> bytes | bytearray | memoryview | np.ndarray:
        """What ``infer`` sends for ``image``: raw buffers and numpy arrays of
        the model's exact size as they are, other images preprocessed to
        the model's input size."""
        return self._inputs(if_id, image)

    def infer(self, if_id: int, image: ImageLike, *, k: int = 5) -> list[Prediction]:
        """Classifies ``image`` with inference function ``if_id``; blocks (GIL
        released) until the answer. Returns the top ``k`` (at most the
        platform's top_k) predictions, highest score first; raises a
        :class:`KneepointError` subclass."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        return self.infer_full(if_id, image).predictions[:k]

    def infer_full(self, if_id: int, image: ImageLike) -> Answer:
        """:meth:`infer` with the whole answer (batch size, latencies)."""
        return self._native.infer(if_id, image)

    def submit(self, if_id: int, image: ImageLike) -> int:
        """Sends ``image`` to ``if_id`` and returns its request id at once;
        collect the result with :meth:`wait` or :meth:`poll` (once)."""
        return self._native.submit(if_id, image)

    def wait(self, request_id: int) -> Answer:
        """Blocks until request ``request_id`` ends; its answer, or raises."""
        return self._native.wait(request_id)

    def poll(self, timeout: float = 0.0) -> list[tuple[int, Answer | KneepointError]]:
        """Waits up to ``timeout`` seconds for submitted requests to end and
        returns those that did, each with its answer or its exception."""
        return self._native.poll(float(timeout))

    def outstanding(self) -> int:
        """Requests sent and not ended."""
        return self._native.outstanding()

    def stats(self) -> dict[str, int]:
        """The client's counters: submitted, answered, timed_out, unreachable,
        duplicates, late, unexpected, malformed."""
        return self._native.stats()

    @property
    def local_addr(self) -> str:
        """The socket's local ``host:port``."""
        return self._native.local_addr()
