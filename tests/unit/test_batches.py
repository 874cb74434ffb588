"""How a runner cuts its batches (streams/worker/pipeline/runner.py, `Batches`):
what arrives while the batch in hand is still being prepared joins the next
batch, up to the batch size, in order; a lone event is never held back."""

from __future__ import annotations

import asyncio

import pytest

from streams.worker.pipeline.runner import Batches


class Stream:
    """The stream's batches, fed by the test: `read` waits for the next one."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue = asyncio.Queue()
        self.reads = 0

    async def read(self) -> list:
        self.reads += 1
        batch = await self.queue.get()
        if batch is None:
            raise StopAsyncIteration
        return batch

    async def settled(self) -> None:
        """Until every task that can run has run (a bounded number of loop turns)."""
        for _ in range(20):
            await asyncio.sleep(0)


def run(test):
    return asyncio.run(asyncio.wait_for(test(), timeout=10))


def test_a_batch_goes_at_once_when_nothing_is_being_prepared():
    async def test():
        stream = Stream()
        batches = Batches(stream.read, most=256)
        stream.queue.put_nowait([1, 2])
        assert await batches.next(None) == [1, 2]
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        stream.queue.put_nowait([3])
        assert await batches.next(done) == [3]  # the batch before is prepared: not held for company
        batches.close()
    run(test)


def test_what_arrives_while_the_batch_before_is_prepared_joins_the_next():
    async def test():
        stream = Stream()
        batches = Batches(stream.read, most=256)
        busy = asyncio.get_running_loop().create_future()
        nxt = asyncio.ensure_future(batches.next(busy))
        for batch in ([1, 2], [3], [4, 5, 6]):
            stream.queue.put_nowait(batch)
            await stream.settled()
            assert not nxt.done()  # the batch before is still being prepared
        busy.set_result(None)
        assert await nxt == [1, 2, 3, 4, 5, 6]
        stream.queue.put_nowait([7])  # the read left in flight serves the batch after
        assert await batches.next(busy) == [7]
        batches.close()
    run(test)


def test_a_join_stops_at_the_batch_size_and_the_rest_opens_the_next_batch():
    async def test():
        stream = Stream()
        batches = Batches(stream.read, most=4)
        busy = asyncio.get_running_loop().create_future()
        stream.queue.put_nowait([1, 2, 3])
        stream.queue.put_nowait([4, 5, 6])
        assert await batches.next(busy) == [1, 2, 3, 4]  # full: handed out while the one before is prepared
        stream.queue.put_nowait([7])
        nxt = asyncio.ensure_future(batches.next(busy))
        await stream.settled()
        assert not nxt.done()
        busy.cancel()  # a batch given up counts as done with
        assert await nxt == [5, 6, 7]
        batches.close()
    run(test)


def test_a_batch_is_never_empty_and_waits_for_its_first_event_even_when_nothing_is_busy():
    async def test():
        stream = Stream()
        batches = Batches(stream.read, most=8)
        nxt = asyncio.ensure_future(batches.next(None))
        stream.queue.put_nowait([])  # a read that yields nothing (streams/worker/read_order.py dropped it all)
        await stream.settled()
        assert not nxt.done()
        stream.queue.put_nowait([1])
        assert await nxt == [1]
        batches.close()
    run(test)


def test_the_end_of_the_stream_and_close():
    async def test():
        stream = Stream()
        batches = Batches(stream.read, most=8)
        stream.queue.put_nowait(None)
        with pytest.raises(StopAsyncIteration):
            await batches.next(None)
        nxt = asyncio.ensure_future(batches.next(None))
        await stream.settled()
        coming = batches.coming
        assert coming is not None and not coming.done()
        nxt.cancel()  # the run stops: the batch it waited for is not handled
        batches.close()  # nor is the read in flight left running
        await stream.settled()
        assert coming.cancelled()
    run(test)
