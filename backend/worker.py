"""The engine thread: the only thread that touches the Engine (and so the KV pool and torch).

Invariant: the event loop never calls the engine directly; it sends commands through a queue and
receives each step's outputs on the loop, so a model step never blocks request handling. With
`boot`, the model is also built on that thread: on the CPU, torch runs about 1.6x slower on a
thread other than the one whose OpenMP pool loaded the weights.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from backend.engine.engine import Engine, StepOutput
from backend.engine.plan import SamplingParams
from backend.engine.scheduler import OverCapacity
from backend.engine.sequence import Segment
from backend.errors import BackendError, ContextLengthExceeded, EngineDown
from backend.threads import ThreadGovernor
from kvfence.capability import Namespace

log = logging.getLogger("kvfence.backend.worker")
T = TypeVar("T")
# A request's outputs: (choice index, output), or the error that ended it.
Outputs = asyncio.Queue[tuple[int, StepOutput] | BaseException]


@dataclass(frozen=True, slots=True)
class _Add:
    stream_id: int
    namespace: Namespace
    prompt: list[int]
    sampling: SamplingParams
    eos: tuple[int, ...]
    public: tuple[Segment, ...] = ()


@dataclass(frozen=True, slots=True)
class _Abort:
    stream_id: int


@dataclass(frozen=True, slots=True)
class _Call:
    fn: Callable[[Engine], Any]
    future: asyncio.Future[Any]


_Command = _Add | _Abort | _Call | None


class EngineWorker:
    """Runs `Engine.step()` in a loop on one thread; requests stream outputs through queues."""

    def __init__(self, engine: Engine | None = None) -> None:
        self._engine = engine
        self._commands: queue.SimpleQueue[_Command] = queue.SimpleQueue()
        self._streams: dict[int, tuple[Outputs, int]] = {}  # stream id -> (queue, choice)
        self._stream_ids = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.governor: ThreadGovernor | None = None  # after every step, and while resting
        self.start_threads = 0  # the kernels' thread count at start-up (0: not a CPU count)

    @classmethod
    def boot(cls, build: Callable[[], tuple[Engine, T]]) -> tuple[EngineWorker, T]:
        """Starts the engine thread and runs `build` on it; returns once the engine exists.
        An exception from `build` is raised here, in the caller's thread."""
        worker = cls()
        built: list[T] = []
        ready = threading.Event()

        def run() -> None:
            try:
                worker._engine, extra = build()
                built.append(extra)
            except BaseException as exc:  # handed to the booting thread below
                worker._error = exc
                return
            finally:
                ready.set()
            worker._run()

        worker._thread = threading.Thread(target=run, name="kvfence-engine", daemon=True)
        worker._thread.start()
        ready.wait()
        if worker._error is not None:
            raise worker._error
        return worker, built[0]

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="kvfence-engine", daemon=True)
            self._thread.start()

    async def stop(self) -> None:
        self._commands.put(None)
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 30.0)

    @property
    def block_size(self) -> int:
        assert self._engine is not None
        return self._engine.config.block_size

    @property
    def threads(self) -> int:
        """The kernels' thread count now."""
        return self.governor.threads if self.governor is not None else self.start_threads

    @property
    def healthy(self) -> bool:
        return self._error is None and self._thread is not None and self._thread.is_alive()

    def submit(
        self,
        namespace: Namespace,
        prompt: list[int],
        choices: Sequence[SamplingParams],
        eos: tuple[int, ...],
        public: tuple[Segment, ...] = (),
    ) -> tuple[tuple[int, ...], Outputs]:
        """Queue a request of one sequence per choice (in choice order); returns their stream
        ids and the one queue all their outputs arrive on, tagged with the choice's index.
        `public`: the prompt's leading blocks that belong to public namespaces, the same for
        every choice since they share the prompt."""
        if self._error is not None:
            raise EngineDown("the engine is not running") from self._error
        outputs: Outputs = asyncio.Queue()
        stream_ids = tuple(next(self._stream_ids) for _ in choices)
        for index, (stream_id, sampling) in enumerate(zip(stream_ids, choices, strict=True)):
            self._streams[stream_id] = (outputs, index)
            self._commands.put(_Add(stream_id, namespace, prompt, sampling, eos, public))
        return stream_ids, outputs

    def abort(self, stream_id: int) -> None:
        """Frees the request's blocks at once (on the engine thread's next turn)."""
        if self._streams.pop(stream_id, None) is not None:
            self._commands.put(_Abort(stream_id))

    async def call(self, fn: Callable[[Engine], Any]) -> Any:
        """Runs `fn(engine)` on the engine thread between steps (flush, stats)."""
        assert self._loop is not None
        future: asyncio.Future[Any] = self._loop.create_future()
        self._commands.put(_Call(fn, future))
        return await future

    # engine thread

    def _run(self) -> None:
        engine = self._engine
        assert engine is not None
        seq_of: dict[int, int] = {}  # stream id -> engine sequence id
        stream_of: dict[int, int] = {}  # engine sequence id -> stream id
        try:
            while True:
                block = not engine.has_work()
                if block and self.governor is not None:
                    self.governor.idle()
                if not self._drain(engine, block, seq_of, stream_of):
                    return
                if engine.has_work():
                    if self.governor is not None:
                        self.governor.resume()
                    outputs = engine.step()
                    if self.governor is not None:
                        self.governor.after_step()
                    routed = [(stream_of.get(o.seq_id, 0), o) for o in outputs]
                    for o in outputs:
                        if o.finished:
                            seq_of.pop(stream_of.pop(o.seq_id, 0), None)
                    self._post(self._deliver, routed)
        except BaseException as exc:  # the thread must report any death to every waiting request
            log.exception("engine thread failed")
            self._error = exc
            self._post(self._fail_all, exc)

    def _drain(
        self, engine: Engine, block: bool, seq_of: dict[int, int], stream_of: dict[int, int]
    ) -> bool:
        # While resting, the governor looks at the host once a period (no governor: no ticks).
        tick = self.governor.period_s if self.governor is not None else None
        while True:
            try:
                command = self._commands.get(block=block, timeout=tick if block else None)
            except queue.Empty:
                if not block:
                    return True
                if self.governor is not None:
                    self.governor.resting()
                continue
            block = False
            if command is None:
                return False
            if isinstance(command, _Add):
                self._add(engine, command, seq_of, stream_of)
            elif isinstance(command, _Abort):
                seq = seq_of.pop(command.stream_id, None)
                if seq is not None:
                    stream_of.pop(seq, None)
                    engine.abort(seq)
            else:
                self._call(engine, command)

    def _add(
        self, engine: Engine, command: _Add, seq_of: dict[int, int], stream_of: dict[int, int]
    ) -> None:
        try:
            seq = engine.add(
                command.namespace, command.prompt, command.sampling, command.eos, command.public
            )
        except OverCapacity as exc:  # the engine's refusal, answered as the client's error
            self._post(self._deliver_error, command.stream_id, ContextLengthExceeded(str(exc)))
            return
        except (BackendError, ValueError) as exc:
            self._post(self._deliver_error, command.stream_id, exc)
            return
        seq_of[command.stream_id] = seq
        stream_of[seq] = command.stream_id

    def _call(self, engine: Engine, command: _Call) -> None:
        try:
            result = command.fn(engine)
        except Exception as exc:  # handed to the awaiting coroutine, not swallowed
            self._post(_settle_error, command.future, exc)
        else:
            self._post(_settle, command.future, result)

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        assert self._loop is not None
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(fn, *args)

    # event loop side

    def _deliver(self, routed: list[tuple[int, StepOutput]]) -> None:
        for stream_id, output in routed:
            stream = self._streams.get(stream_id)
            if stream is not None:
                stream[0].put_nowait((stream[1], output))
                if output.finished:
                    self._streams.pop(stream_id, None)

    def _deliver_error(self, stream_id: int, exc: BaseException) -> None:
        stream = self._streams.pop(stream_id, None)
        if stream is not None:
            stream[0].put_nowait(exc)

    def _fail_all(self, exc: BaseException) -> None:
        failure = EngineDown("the engine has stopped")
        failure.__cause__ = exc
        for outputs in {id(q): q for q, _ in self._streams.values()}.values():
            outputs.put_nowait(failure)
        self._streams.clear()


def _settle(future: asyncio.Future[Any], result: Any) -> None:
    if not future.done():
        future.set_result(result)


def _settle_error(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
