"""kneepoint's Python package without a platform: errors, input handling,
the model repository, preprocessing against the Rust reference bytes.

Run: .venv/bin/python -m unittest discover -s python/tests (make test).
"""

from __future__ import annotations

import gc
import os
import socket
import struct
import tempfile
import threading
import time
import unittest
from pathlib import Path

import numpy as np

import kneepoint

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "models"
COFFEE = REPO / "build" / "photos" / "coffee.png"
COFFEE_U8 = MODELS / "efficientnet_lite0" / "check" / "photo_coffee.u8"
HEADER = struct.Struct(">IBBHQIHHQ")  # docs/PROTOCOL.md, request fragment


def write_repo(root: Path) -> Path:
    """A model repository of two small image models: if 3 (4x5, labels)
    and if 4 (2x2, no labels), and if 5 taking f32 tensors."""

    def model(name: str, if_id: int, shape: list[int], labels: bool, fmt: str = "rgb_u8_hwc") -> None:
        d = root / name
        d.mkdir()
        text = f'name = "{name}"\nif_id = {if_id}\n'
        if labels:
            text += 'labels = "labels.txt"\n'
            (d / "labels.txt").write_text("zero\none\ntwo\n")
        text += f'[input]\nformat = "{fmt}"\nshape = {shape}\n'
        (d / "config.toml").write_text(text)

    model("small", 3, [3, 4, 5], labels=True)
    model("tiny", 4, [3, 2, 2], labels=False)
    model("tensor", 5, [3, 2, 2], labels=False, fmt="f32_nchw")
    return root


class Sink:
    """A UDP socket that receives and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.addr = "127.0.0.1:%d" % self.sock.getsockname()[1]

    def requests(self, wait: float = 0.5) -> dict[int, bytes]:
        """Every request received so far, reassembled: request_id -> payload."""
        frags: dict[int, dict[int, bytes]] = {}
        self.sock.settimeout(wait)
        try:
            while True:
                d = self.sock.recv(65536)
                self.sock.settimeout(0.05)
                magic, ver, typ, _if, rid, total, idx, count, _ts = HEADER.unpack_from(d)
                assert (magic, ver, typ) == (0x4B4E5054, 1, 1)
                frags.setdefault(rid, {})[idx] = d[HEADER.size :]
        except socket.timeout:
            pass
        return {rid: b"".join(f[i] for i in sorted(f)) for rid, f in frags.items()}

    def close(self) -> None:
        self.sock.close()


class Answerer(Sink):
    """A UDP socket that answers every complete request OK with class 2
    (score 0.75) then class 0 (0.25), batch size 3, latency 1234 µs."""

    RESPONSE = struct.Struct(">IBBHQQIHHI")

    def __init__(self) -> None:
        super().__init__()
        self.sock.settimeout(0.05)
        self.stop = False
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        got: dict[int, set[int]] = {}
        while not self.stop:
            try:
                d, peer = self.sock.recvfrom(65536)
            except (socket.timeout, OSError):
                continue
            _m, _v, _t, if_id, rid, _total, idx, count, ts = HEADER.unpack_from(d)
            got.setdefault(rid, set()).add(idx)
            if len(got[rid]) == count:
                head = self.RESPONSE.pack(0x4B4E5054, 1, 2, if_id, rid, ts, 0, 2, 3, 1234)
                self.sock.sendto(head + struct.pack(">IfIf", 2, 0.75, 0, 0.25), peer)

    def close(self) -> None:
        self.stop = True
        self.thread.join()
        super().close()


class Answers(unittest.TestCase):
    """What an answer looks like in Python (kneepoint.Answer, Prediction)."""

    def setUp(self) -> None:
        self.tmp = tempfile.TemporaryDirectory()
        self.repo = write_repo(Path(self.tmp.name))
        self.peer = Answerer()

    def tearDown(self) -> None:
        self.peer.close()
        self.tmp.cleanup()

    def test_an_answer_carries_labelled_predictions(self) -> None:
        c = kneepoint.Client(self.peer.addr, models=self.repo, timeout=5)
        a = c.infer_full(3, np.zeros((4, 5, 3), np.uint8))
        self.assertIsInstance(a, kneepoint.Answer)
        self.assertEqual((a.if_id, a.batch_size, a.platform_latency_us), (3, 3, 1234))
        self.assertTrue(0 < a.rtt < 5)
        self.assertEqual(a.predictions, [(2, "two", 0.75), (0, "zero", 0.25)])
        p = a.predictions[0]
        self.assertIsInstance(p, kneepoint.Prediction)
        self.assertEqual((p.class_id, p.label, p.score), (2, "two", 0.75))
        # As the 3-tuple it stands for: unpacking, indexing, len, hashing.
        class_id, label, score = p
        self.assertEqual((class_id, label, score), (2, "two", 0.75))
        self.assertEqual((p[0], p[-1], len(p)), (2, 0.75, 3))
        with self.assertRaises(IndexError):
            p[3]
        self.assertEqual(p, kneepoint.Prediction(2, "two", 0.75))
        self.assertNotEqual(p, (2, "two", 0.5))
        self.assertEqual(hash(p), hash((2, "two", 0.75)))
        self.assertEqual(repr(p), "Prediction(class_id=2, label='two', score=0.75)")
        with self.assertRaises(AttributeError):
            p.label = "x"  # type: ignore[misc]
        with self.assertRaises(AttributeError):
            a.rtt = 0.0  # type: ignore[misc]
        self.assertEqual(c.infer(3, np.zeros((4, 5, 3), np.uint8), k=1), [(2, "two", 0.75)])
        # No labels for if 4, none without a repository.
        self.assertEqual(c.infer(4, np.zeros((2, 2, 3), np.uint8))[0].label, None)
        bare = kneepoint.Client(self.peer.addr, models=False, timeout=5)
        self.assertEqual(bare.infer(3, b"\x00" * 60), [(2, None, 0.75), (0, None, 0.25)])

    def test_submit_wait_and_poll_give_answers_once(self) -> None:
        c = kneepoint.Client(self.peer.addr, models=self.repo, timeout=5)
        ids = [c.submit(3, bytes([i]) * 60) for i in range(4)]
        self.assertEqual(c.wait(ids[0]).request_id, ids[0])
        got: dict[int, object] = {}
        deadline = time.monotonic() + 5
        while len(got) < 3 and time.monotonic() < deadline:
            got.update(c.poll(0.5))
        self.assertEqual(sorted(got), sorted(ids[1:]))
        self.assertTrue(all(isinstance(a, kneepoint.Answer) for a in got.values()))
        self.assertEqual({a.predictions[0].label for a in got.values()}, {"two"})  # type: ignore[attr-defined]
        with self.assertRaises(kneepoint.UnknownRequestError):
            c.wait(ids[1])
        self.assertEqual(c.stats()["answered"], 4)


class ClientErrors(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = tempfile.TemporaryDirectory()
        self.repo = write_repo(Path(self.tmp.name))
        self.sink = Sink()

    def tearDown(self) -> None:
        self.sink.close()
        self.tmp.cleanup()

    def test_a_closed_port_is_unreachable(self) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        c = kneepoint.Client(f"127.0.0.1:{port}", models=False, timeout=5.0)
        t0 = time.monotonic()
        with self.assertRaises(kneepoint.UnreachableError) as cm:
            for _ in range(3):  # the ICMP reply may come after the first send
                c.infer(1, b"\x01" * 3000)
        self.assertIsInstance(cm.exception, ConnectionError)
        self.assertIsInstance(cm.exception, kneepoint.KneepointError)
        self.assertLess(time.monotonic() - t0, 2.0, "unreachable must not wait for the timeout")

    def test_no_answer_is_a_timeout(self) -> None:
        c = kneepoint.Client(self.sink.addr, models=False, timeout=0.2)
        t0 = time.monotonic()
        with self.assertRaises(kneepoint.TimeoutError) as cm:
            c.infer(7, b"abc")
        took = time.monotonic() - t0
        self.assertIsInstance(cm.exception, TimeoutError)  # the builtin
        self.assertTrue(cm.exception.retryable)
        self.assertGreaterEqual(took, 0.19)
        self.assertLess(took, 2.0)
        self.assertEqual(list(self.sink.requests().values()), [b"abc"])
        self.assertEqual(c.stats()["timed_out"], 1)

    def test_retries_are_new_requests(self) -> None:
        c = kneepoint.Client(self.sink.addr, models=False, timeout=0.2, retries=2)
        t0 = time.monotonic()
        with self.assertRaises(kneepoint.TimeoutError):
            c.infer(7, b"again")
        self.assertGreaterEqual(time.monotonic() - t0, 0.59)
        sent = self.sink.requests()
        # Three requests, three request ids, the same input.
        self.assertEqual(sorted(sent.values()), [b"again"] * 3)
        self.assertEqual(c.stats()["timed_out"], 3)
        with self.assertRaises(ValueError):
            kneepoint.Client(self.sink.addr, models=False, retries=-1)

    def test_threads_wait_at_once_with_the_gil_released(self) -> None:
        c = kneepoint.Client(self.sink.addr, models=False, timeout=0.5)
        errors: list[BaseException] = []

        def one() -> None:
            try:
                c.infer(1, b"x" * 5000)
            except BaseException as e:  # noqa: BLE001 - collected, checked below
                errors.append(e)

        threads = [threading.Thread(target=one) for _ in range(8)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        took = time.monotonic() - t0
        self.assertEqual(len(errors), 8)
        self.assertTrue(all(isinstance(e, kneepoint.TimeoutError) for e in errors), errors)
        # Serialised waits (GIL held) would take 8 x 0.5 s.
        self.assertLess(took, 2.0)
        self.assertEqual(len(self.sink.requests()), 8)

    def test_wrong_size_and_empty_inputs_are_refused_before_sending(self) -> None:
        c = kneepoint.Client(self.sink.addr, models=self.repo)
        with self.assertRaises(kneepoint.WrongSizeError) as cm:
            c.infer(3, b"\x00" * 59)
        e = cm.exception
        self.assertIsInstance(e, ValueError)
        self.assertEqual((e.if_id, e.expected, e.got), (3, 60, 59))
        with self.assertRaises(kneepoint.WrongSizeError):
            c.infer(5, np.zeros(47, np.uint8))  # f32 tensor: 3*2*2*4 = 48 bytes
        with self.assertRaises(kneepoint.EmptyInputError):
            kneepoint.Client(self.sink.addr, models=False).submit(9, b"")
        self.assertEqual(self.sink.requests(wait=0.2), {})

    def test_an_if_id_not_in_the_repository_is_unknown_locally(self) -> None:
        c = kneepoint.Client(self.sink.addr, models=self.repo)
        with self.assertRaises(kneepoint.UnknownIfError) as cm:
            c.infer(77, b"abc")
        self.assertEqual(cm.exception.if_id, 77)
        self.assertIsInstance(cm.exception, kneepoint.PlatformError)
        self.assertEqual(self.sink.requests(wait=0.2), {})

    def test_labels_come_from_the_repository(self) -> None:
        c = kneepoint.Client(self.sink.addr, models=self.repo)
        self.assertEqual(c.labels(3), ("zero", "one", "two"))
        with self.assertRaises(kneepoint.NoLabelsError) as cm:
            c.labels(4)
        self.assertEqual(cm.exception.if_id, 4)
        with self.assertRaises(kneepoint.UnknownIfError):
            c.labels(99)
        with self.assertRaises(kneepoint.NoLabelsError):
            kneepoint.Client(self.sink.addr, models=False).labels(3)
        self.assertEqual(sorted(c.models or {}), [3, 4, 5])

    def test_a_dropped_client_stops_its_thread_without_the_gc(self) -> None:
        # No reference cycle through the native client: dropping the last
        # reference closes the socket and joins the receiver thread at once.
        def threads() -> int:
            return len(os.listdir("/proc/self/task"))

        gc.disable()
        try:
            before = threads()
            clients = [kneepoint.Client(self.sink.addr, models=self.repo) for _ in range(3)]
            self.assertEqual(threads(), before + 3)
            del clients
            self.assertEqual(threads(), before)
        finally:
            gc.enable()

    def test_a_bad_repository_is_a_typed_error(self) -> None:
        bad = Path(self.tmp.name) / "bad"
        (bad / "m").mkdir(parents=True)
        (bad / "m" / "config.toml").write_text('name = "m"\n[input]\nshape = [3, 2]\n')
        with self.assertRaises(kneepoint.ModelRepositoryError):
            kneepoint.Client(self.sink.addr, models=bad)
        with self.assertRaises(kneepoint.ModelRepositoryError):
            kneepoint.Client(self.sink.addr, models=Path(self.tmp.name) / "absent")

    def test_bad_settings_and_inputs_are_typed_errors(self) -> None:
        with self.assertRaises(kneepoint.ConfigError):
            kneepoint.Client("[::1]:9000", models=False)
        with self.assertRaises(kneepoint.ConfigError):
            kneepoint.Client(self.sink.addr, models=False, fragment_payload=0)
        with self.assertRaises(ValueError):
            kneepoint.Client(self.sink.addr, models=False, timeout=0)
        c = kneepoint.Client(self.sink.addr, models=self.repo)
        with self.assertRaises(kneepoint.ImageError):
            c.infer(3, np.zeros((4, 5, 3), np.float32))
        with self.assertRaises(TypeError):
            c.infer(3, 3.14)  # type: ignore[arg-type]
        with self.assertRaises(kneepoint.ImageError):
            c.infer(3, Path(self.tmp.name) / "no-such.png")
        with self.assertRaises(kneepoint.NoModelError):
            c.infer(5, REPO / "no-such.png")  # an f32 model: no images
        with self.assertRaises(kneepoint.WrongSizeError):
            c.infer(5, np.zeros((9, 9, 3), np.uint8))  # raw bytes for it
        with self.assertRaises(kneepoint.NoModelError):
            kneepoint.Client(self.sink.addr, models=False).infer(3, REPO / "photo.png")
        with self.assertRaises(ValueError):
            c.infer(3, b"\x00" * 60, k=0)
        with self.assertRaises(TypeError):
            kneepoint.Client(self.sink.addr, models=False).submit(3, 3.14)  # type: ignore[arg-type]
        self.assertEqual(self.sink.requests(wait=0.2), {})

    def test_submit_poll_and_wait(self) -> None:
        c = kneepoint.Client(self.sink.addr, models=False, timeout=0.2)
        ids = [c.submit(1, bytes([i]) * 10) for i in range(3)]
        self.assertEqual(len(set(ids)), 3)
        self.assertEqual(c.outstanding(), 3)
        ended: list[tuple[int, object]] = []
        deadline = time.monotonic() + 3
        while len(ended) < 2 and time.monotonic() < deadline:
            ended += [r for r in c.poll(0.5) if r[0] != ids[2]]
        self.assertEqual(sorted(i for i, _ in ended), sorted(ids[:2]))
        self.assertTrue(all(isinstance(r, kneepoint.TimeoutError) for _, r in ended))
        # ids[2] was returned by poll too (it timed out with the others) or
        # is still waitable; either way it is collected once.
        with self.assertRaises((kneepoint.TimeoutError, kneepoint.UnknownRequestError)):
            c.wait(ids[2])
        with self.assertRaises(kneepoint.UnknownRequestError):
            c.wait(ids[0])
        self.assertEqual(c.outstanding(), 0)


class Inputs(unittest.TestCase):
    """What goes on the wire for each kind of input."""

    def setUp(self) -> None:
        self.tmp = tempfile.TemporaryDirectory()
        self.repo = write_repo(Path(self.tmp.name))
        self.sink = Sink()
        self.c = kneepoint.Client(self.sink.addr, models=self.repo, timeout=30, fragment_payload=7)

    def tearDown(self) -> None:
        self.sink.close()
        self.tmp.cleanup()

    def sent(self, image: kneepoint.ImageLike) -> bytes:
        rid = self.c.submit(3, image)
        return self.sink.requests()[rid]

    def test_an_array_of_the_model_size_is_sent_as_is(self) -> None:
        a = np.arange(60, dtype=np.uint8).reshape(4, 5, 3)
        self.assertEqual(self.sent(a), a.tobytes())
        # Not C-contiguous: made contiguous, same pixels.
        f = np.asfortranarray(a)
        self.assertEqual(self.sent(f), a.tobytes())
        r = a[::-1, ::-1]  # negative strides
        self.assertEqual(self.sent(r), np.ascontiguousarray(r).tobytes())
        ro = a.copy()
        ro.flags.writeable = False
        self.assertEqual(self.sent(ro), a.tobytes())
        self.assertEqual(self.sent(bytearray(a.tobytes())), a.tobytes())
        self.assertEqual(self.sent(memoryview(a.tobytes())), a.tobytes())

    def test_other_sizes_are_preprocessed_by_the_rust_code(self) -> None:
        rng = np.random.default_rng(1)
        a = rng.integers(0, 256, (31, 17, 3), dtype=np.uint8)
        want = kneepoint.preprocess(a, 4, 5)
        self.assertEqual(want.shape, (4, 5, 3))
        self.assertEqual(self.sent(a), want.tobytes())

    def test_pil_images_go_through_the_same_code(self) -> None:
        try:
            from PIL import Image
        except ImportError:
            self.skipTest("Pillow is not installed")
        rng = np.random.default_rng(2)
        a = rng.integers(0, 256, (40, 30, 3), dtype=np.uint8)
        self.assertEqual(self.sent(Image.fromarray(a)), kneepoint.preprocess(a, 4, 5).tobytes())
        # RGBA: alpha dropped, as the Rust crate's to_rgb8().
        rgba = np.concatenate([a, np.full((40, 30, 1), 7, np.uint8)], axis=2)
        self.assertEqual(
            self.sent(Image.fromarray(rgba, "RGBA")), kneepoint.preprocess(a, 4, 5).tobytes()
        )

    def test_preprocess_checks_its_input(self) -> None:
        with self.assertRaises(kneepoint.ImageError):
            kneepoint.preprocess(np.zeros((0, 4, 3), np.uint8), 4, 4)
        with self.assertRaises(kneepoint.ImageError):
            kneepoint.preprocess(np.zeros((4, 4, 4), np.uint8), 4, 4)
        with self.assertRaises(ValueError):
            kneepoint.preprocess(np.zeros((4, 4, 3), np.uint8), 0, 4)
        with self.assertRaises(kneepoint.ImageError):
            kneepoint._native.decode_image(b"not an image", 4, 4)


@unittest.skipUnless(
    COFFEE.exists() and COFFEE_U8.exists(),
    f"needs {COFFEE} and {COFFEE_U8} (make models)",
)
class RustReference(unittest.TestCase):
    """The photo the model repository checks efficientnet_lite0 on, made
    into its 224x224 input by every route, equals the reference bytes."""

    def test_every_route_gives_the_same_bytes(self) -> None:
        want = kneepoint.preprocess(COFFEE, 224, 224).tobytes()
        self.assertEqual(len(want), 224 * 224 * 3)
        self.assertEqual(kneepoint.preprocess(str(COFFEE), 224, 224).tobytes(), want)
        self.assertEqual(kneepoint._native.decode_image(COFFEE.read_bytes(), 224, 224), want)
        try:
            from PIL import Image
        except ImportError:
            return
        with Image.open(COFFEE) as im:
            self.assertEqual(kneepoint.preprocess(im, 224, 224).tobytes(), want)
            self.assertEqual(kneepoint.preprocess(np.asarray(im.convert("RGB")), 224, 224).tobytes(), want)

    def test_they_are_the_reference_bytes(self) -> None:
        # scripts/prepare_models.py's resize_shorter_crop(), which the Rust
        # crate's image::preprocess follows bit for bit.
        got = kneepoint.preprocess(COFFEE, 224, 224).tobytes()
        want = COFFEE_U8.read_bytes()
        differ = sum(a != b for a, b in zip(got, want))
        self.assertEqual(differ, 0, f"{differ} of {len(want)} bytes differ from {COFFEE_U8}")


if __name__ == "__main__":
    unittest.main()
