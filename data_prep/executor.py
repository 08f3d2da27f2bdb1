"""Executors run shard tasks: a local process pool (default) or a Dask distributed cluster.

Both expose ``map_unordered(fn, items)``: results are yielded as tasks finish, with a bounded number of tasks
in flight so a corpus of thousands of shards is never submitted (or held) at once. Every worker process runs
torch single-threaded: parallelism comes from workers, and a worker must not oversubscribe the cores.
"""

from __future__ import annotations

import itertools
import multiprocessing
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Protocol

import torch

IN_FLIGHT_PER_WORKER = 2  # queued tasks per worker: keeps workers busy without holding the whole plan
LOOPBACK = "127.0.0.1"
# NOTE: fork starts a worker in ~0.1 s; spawn re-imports torch in every worker (2-9 s on a busy 2-core box),
# which would dominate small jobs. Forked workers run torch single-threaded (see single_threaded_torch).
START_METHOD = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"


@dataclass
class LocalExecutorConfig:
    kind: str = "local"


@dataclass
class DaskExecutorConfig:
    kind: str = "dask"
    address: str | None = None  # tcp://HOST:PORT of a running scheduler; None starts a LocalCluster
    host: str = LOOPBACK  # LocalCluster only: interface its scheduler and workers listen on


ExecutorConfig = LocalExecutorConfig | DaskExecutorConfig


class Executor(Protocol):
    def map_unordered(self, fn: Callable, items: Iterable) -> Iterator[Any]: ...

    def close(self) -> None: ...


def single_threaded_torch() -> None:
    """Worker initializer: one intra-op thread per worker process."""
    torch.set_num_threads(1)


def _call_single_threaded(fn: Callable, item: Any) -> Any:
    """Dask task wrapper: workers may join the cluster at any time, so each task sets the thread count."""
    single_threaded_torch()
    return fn(item)


class InlineExecutor:
    """Runs tasks one by one in this process (workers=1): no process start-up, no pickling."""

    def __init__(self) -> None:
        self._threads = torch.get_num_threads()
        torch.set_num_threads(1)

    def map_unordered(self, fn: Callable, items: Iterable) -> Iterator[Any]:
        for item in items:
            yield fn(item)

    def close(self) -> None:
        torch.set_num_threads(self._threads)


class LocalExecutor:
    """A pool of ``workers`` processes on this machine (forked where the platform allows)."""

    def __init__(self, workers: int):
        self.workers = workers
        self._pool = ProcessPoolExecutor(
            max_workers=workers,
            mp_context=multiprocessing.get_context(START_METHOD),
            initializer=single_threaded_torch,
        )

    def map_unordered(self, fn: Callable, items: Iterable) -> Iterator[Any]:
        pending: set[Future] = set()
        for item in items:
            pending.add(self._pool.submit(fn, item))
            if len(pending) >= self.workers * IN_FLIGHT_PER_WORKER:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                yield from (f.result() for f in done)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            yield from (f.result() for f in done)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


class DaskExecutor:
    """Tasks on a Dask distributed cluster: an existing scheduler (``address``) or a LocalCluster.

    Workers of an existing cluster must have this package installed and see the audio and the output
    location under the same paths or URLs as this process (a shared file system or an object store).
    """

    def __init__(self, cfg: DaskExecutorConfig, workers: int):
        from dask.distributed import Client, LocalCluster  # NOTE: imported lazily; dask is slow to import

        self._cluster = None
        if cfg.address is None:
            self._cluster = LocalCluster(
                n_workers=workers,
                threads_per_worker=1,
                processes=True,
                host=cfg.host,
                dashboard_address=None,
            )
        self._client = Client(cfg.address or self._cluster)

    @property
    def slots(self) -> int:
        return max(1, sum(self._client.nthreads().values()))

    def map_unordered(self, fn: Callable, items: Iterable) -> Iterator[Any]:
        from dask.distributed import as_completed

        it = iter(items)
        queue = as_completed([self._submit(fn, item) for item in itertools.islice(it, self._limit())])
        for future in queue:
            result = future.result()
            future.release()
            nxt = next(it, None)
            if nxt is not None:
                queue.add(self._submit(fn, nxt))
            yield result

    def _submit(self, fn: Callable, item: Any):
        return self._client.submit(_call_single_threaded, fn, item, pure=False)

    def _limit(self) -> int:
        return self.slots * IN_FLIGHT_PER_WORKER

    def close(self) -> None:
        self._client.close()
        if self._cluster is not None:
            self._cluster.close()


def build_executor(cfg: ExecutorConfig | None, workers: int) -> Executor:
    """The executor a config asks for; ``workers`` sizes the local pool or the LocalCluster."""
    if cfg is None or cfg.kind == "local":
        return InlineExecutor() if workers <= 1 else LocalExecutor(workers)
    if cfg.kind == "dask":
        return DaskExecutor(cfg, workers)
    raise ValueError(f"unknown executor kind {cfg.kind!r} (expected 'local' or 'dask')")
