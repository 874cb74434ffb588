"""One view shared by the worker's threads, and swapped under them by a rebuild."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

from processors.ports import VectorStore


class SharedView:
    """One view called at once from the event loop's helper threads (API reads,
    projectors) and the reflector's thread, with no lock between the calls:
    both engines the worker opens allow it.

    * Qdrant Edge (qdrant-edge-py 0.9): an `EdgeShard` call holds the GIL for
      its whole run (while another thread ran 29 ms batched searches, the main
      thread went 26 ms without running), so native calls never overlap and
      each is atomic to other threads; the Rust shard is itself synchronized
      (in Qdrant's source: WAL under a mutex, segments under a read-write lock). Hammered from 4
      threads mixing retrieve, count, exact query and scroll with upserts on
      the very segments read (`python tests/benchmarks/view_threads.py
      --rounds 1000 --points 5000`, 3 runs): 1000 upserts and 3000 reads
      each, 0 answers differing from the serial ones, 0 errors, the written
      users as a serial run leaves them; tests/pipeline/test_view_concurrency.py.
      What threads buy is not parallel engine work but turns: the loop and
      the other threads run between calls (scroll pages, payload conversion,
      embedding), where one lock held them all off for a whole scroll.
    * A Qdrant server (`QdrantView`): HTTP requests, concurrent by design.
    * Not qdrant-client's local mode, which is not thread-safe (the same hammer,
      `--engine local --rounds 100`: ~300 errors in 400 calls, from sqlite "cannot commit" to numpy
      IndexError, and a collection left unreadable). `open_view` never opens
      it; tests use it from one thread.

    A multi-call write (`strip`) may be seen half done, as on a server. What
    stays exclusive is `swap`: it waits for the calls in flight, so the view it
    returns is no longer in use and may be dropped, and calls made meanwhile
    wait for it and go to the new view.
    """

    WRITES = frozenset({"upsert", "strip", "patch", "forget"})

    def __init__(self, view: VectorStore) -> None:
        self._view = view
        self._turns = threading.Condition()
        self._in_flight, self._swapping = 0, False
        self._writing, self._writes_held = 0, False

    def pause_writes(self) -> None:
        """Once no write runs, none starts until `resume_writes` (writes called
        meanwhile wait, reads go on, a swap may come between): what a write
        waiting here writes goes to whichever view serves when it resumes."""
        with self._turns:
            self._turns.wait_for(lambda: not self._writes_held)
            self._writes_held = True
            self._turns.wait_for(lambda: self._writing == 0)

    def resume_writes(self) -> None:
        with self._turns:
            self._writes_held = False
            self._turns.notify_all()

    @contextmanager
    def writes_paused(self) -> Iterator[None]:
        """No write runs until the block ends (none is left halfway)."""
        self.pause_writes()
        try:
            yield
        finally:
            self.resume_writes()

    @contextmanager
    def writes_held(self) -> Iterator[VectorStore]:
        """The view with no write running until the block ends: a compaction copies its files here."""
        with self.writes_paused(), self._current() as view:
            yield view

    def swap(self, view: VectorStore) -> VectorStore:
        """Serve `view` from the next call on; returns the one it replaces, idle."""
        with self._turns:
            self._turns.wait_for(lambda: not self._swapping)
            self._swapping = True  # new calls wait: a busy view would never go idle
            self._turns.wait_for(lambda: self._in_flight == 0)
            old, self._view, self._swapping = self._view, view, False
            self._turns.notify_all()
            return old

    @contextmanager
    def _current(self, write: bool = False) -> Iterator[VectorStore]:
        """The view to call, held in use until the call returns."""
        with self._turns:
            self._turns.wait_for(lambda: not self._swapping and not (write and self._writes_held))
            self._in_flight += 1
            self._writing += write
            view = self._view
        try:
            yield view
        finally:
            with self._turns:
                self._in_flight -= 1
                self._writing -= write
                self._turns.notify_all()

    def __getattr__(self, name: str):
        if not callable(getattr(self._view, name)):
            return getattr(self._view, name)

        def call(*args, **kwargs):
            with self._current(write=name in self.WRITES) as view:
                result = getattr(view, name)(*args, **kwargs)
                # A lazy scroll would read the view after the call has returned.
                return iter(list(result)) if isinstance(result, Iterator) else result

        return call
