"""Type stubs of kneepoint._native, the Rust half (python/src/lib.rs)."""

from os import PathLike
from typing import Any, Callable, Iterator

from ._errors import KneepointError

DEFAULT_FRAGMENT_PAYLOAD: int
MAX_FRAGMENT_PAYLOAD: int

class Prediction:
    """One of an answer's top-k classes; also the 3-tuple (class_id, label, score)."""

    class_id: int
    label: str | None
    score: float
    def __init__(self, class_id: int, label: str | None, score: float) -> None: ...
    def __len__(self) -> int: ...
    def __getitem__(self, index: int) -> int | str | float | None: ...
    def __iter__(self) -> Iterator[int | str | float | None]: ...
    def __hash__(self) -> int: ...

class Answer:
    """A status-OK answer."""

    request_id: int
    if_id: int
    predictions: list[Prediction]
    batch_size: int
    platform_latency_us: int
    rtt: float
#: bytes, or any buffer of unsigned bytes (numpy uint8, bytearray, memoryview).
Buffer = Any

class NativeClient:
    def __init__(
        self,
        addr: str,
        timeout: float,
        fragment_payload: int,
        retries: int,
        models: list[tuple[int, int, tuple[int, int] | None, list[str] | None]] | None,
        convert: Callable[[int, Any], Buffer] | None = None,
        ndarray: type | None = None,
    ) -> None: ...
    def infer(self, if_id: int, data: Buffer) -> Answer: ...
    def submit(self, if_id: int, data: Buffer) -> int: ...
    def wait(self, request_id: int) -> Answer: ...
    def poll(self, timeout: float) -> list[tuple[int, Answer | KneepointError]]: ...
    def outstanding(self) -> int: ...
    def stats(self) -> dict[str, int]: ...
    def local_addr(self) -> str: ...

def preprocess_rgb(rgb: Buffer, height: int, width: int, out_height: int, out_width: int) -> bytes: ...
def load_image(path: str | PathLike[str], height: int, width: int) -> bytes: ...
def decode_image(data: Buffer, height: int, width: int) -> bytes: ...
def resize_short_side(height: int, width: int) -> int: ...
