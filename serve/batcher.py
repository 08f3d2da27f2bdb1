"""Micro-batching: concurrent requests wait up to ``max_wait_ms`` to share one model call in a worker thread."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class MicroBatcher(Generic[T, R]):
    """Runs ``fn(items) -> results`` (same order) on batches of up to ``max_batch_size`` queued items.

    One worker thread runs the batches one after another, so the event loop stays free to accept requests
    and the model is never called concurrently; while it works, new requests queue up and form the next batch.
    A batch waits (at most ``max_wait_ms``) only while requests announced with ``expecting()`` are still on
    their way, so a lone request never pays the wait.
    """

    def __init__(self, fn: Callable[[list[T]], list[R]], max_batch_size: int, max_wait_ms: float):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.fn, self.max_batch_size, self.max_wait_s = fn, max_batch_size, max_wait_ms / 1000
        self._pending: deque[tuple[T, asyncio.Future]] = deque()
        self._ready = asyncio.Event()  # something is pending
        self._arrived = asyncio.Event()  # an item was submitted or an expected one was withdrawn
        self._incoming = 0  # requests being prepared (upload, decode, features) that will submit soon
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="asr-batch")
        self._task: asyncio.Task | None = None
        self.batches = 0  # model calls so far
        self.batched_items = 0  # items they carried (batched_items / batches = mean batch size)

    def start(self) -> None:
        """Start the batching loop on the running event loop."""
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def close(self) -> None:
        """Stop the loop; pending requests fail with CancelledError."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for _, fut in self._pending:
            fut.cancel()
        self._executor.shutdown(wait=True)

    @contextlib.contextmanager
    def expecting(self):
        """Announce a request that is being prepared; batches forming meanwhile may wait for it."""
        self._incoming += 1
        try:
            yield
        finally:
            self._incoming -= 1
            self._arrived.set()

    async def submit(self, item: T) -> R:
        """Queue one item and wait for its result (exceptions from ``fn`` propagate)."""
        fut = asyncio.get_running_loop().create_future()
        self._pending.append((item, fut))
        self._ready.set()
        self._arrived.set()
        return await fut

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._ready.wait()
            await self._gather(loop.time() + self.max_wait_s)
            batch = self._take()
            if batch:
                await self._run(loop, batch)

    async def _gather(self, deadline: float) -> None:
        """Wait until the batch is full, nothing more is expected, or the deadline passes."""
        loop = asyncio.get_running_loop()
        while len(self._pending) < self.max_batch_size and self._incoming > 0:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except TimeoutError:
                return

    def _take(self) -> list[tuple[T, asyncio.Future]]:
        batch = []
        while self._pending and len(batch) < self.max_batch_size:
            item, fut = self._pending.popleft()
            if not fut.done():  # the client may have gone away
                batch.append((item, fut))
        if not self._pending:
            self._ready.clear()
        return batch

    async def _run(self, loop: asyncio.AbstractEventLoop, batch: list[tuple[T, asyncio.Future]]) -> None:
        self.batches += 1
        self.batched_items += len(batch)
        try:
            results = await loop.run_in_executor(self._executor, self.fn, [item for item, _ in batch])
        except Exception as e:  # NOTE: one bad batch fails its requests, never the loop
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(e)
            return
        for (_, fut), result in zip(batch, results, strict=True):
            if not fut.done():
                fut.set_result(result)
