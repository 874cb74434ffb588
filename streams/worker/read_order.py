"""Every record of a pipeline partition reaches its runner, in order: what
Faust delivers is checked against where the consumer was sought.

Faust can drop a record on its way from the consumer to the agents (a record
fetched as a rebalance ends, its channel queue cleared or its stream
skipping it) while the consumer's position has already moved past it. The
pipeline's commits then go past it (a record lost) or, if it was the
partition's last, it is never handled (a stall: the chaos suite saw a
partition's last episode never reach its accumulator, tests/faults/test_chaos.py).
So Reflect keeps, per partition, the offset it expects next: where Faust's
seek at each assignment left the consumer (streams/worker/patches.py), then one past
each record read. A record past it means records in between were dropped:
the partition is sought back there, and what was read meanwhile is read
again. A runner that waits for its next batch while the consumer's position
stays past the expected offset (the dropped record was the partition's
last) seeks back too.

Under the `exactly_once` guarantee a gap is legitimate (the broker's
transaction markers take offsets): there a record past the expected offset
is read on, and the wait for records seeks back once, then takes the
consumer's position as it is. Retention may have deleted what a seek back
asks for: it reads from the earliest offset left.
"""

from __future__ import annotations

import logging

log = logging.getLogger("reflect")


class ReadOrder:
    def __init__(self, app) -> None:
        self.app = app
        self.expected: dict = {}  # TP → the offset the runner reads next …
        self.since: dict = {}  # … as known in this group generation
        self.read_in: dict = {}  # TP → the generation a record of it was last read in
        self.sought_to: dict = {}  # TP → where this worker last sought it back
        self.looked: dict = {}  # TP → (generation, expected, position) at the audit's last look

    def gaps_possible(self) -> bool:
        return bool(self.app.in_transaction)

    def sought(self, targets: dict) -> None:
        """Where Faust's seek (at an assignment) sent each partition: its
        commit, or its start. Records read in this generation before that
        (Faust resumes the partitions before it seeks them) were read from
        there too: the seek brings them again, and they are not read twice."""
        generation = self.app.consumer_generation_id
        for tp, offset in targets.items():
            if self.read_in.get(tp) != generation:
                self.expected[tp] = offset
            self.since[tp] = generation
            self.sought_to.pop(tp, None)

    def _expected(self, tp, generation: int) -> int | None:
        return self.expected.get(tp) if self.since.get(tp) == generation else None

    async def in_order(self, events: list) -> list:
        """The events that come next in their partitions. One past a gap
        seeks its partition back (and is read again, with what follows);
        one already read (a redelivery after such a seek) is dropped."""
        out = []
        for event in events:
            generation = event.message.generation_id
            if generation != self.app.consumer_generation_id:
                out.append(event)  # read before a rebalance: the runner drops it (streams/worker/commits.py)
                continue
            tp, offset = event.message.tp, event.message.offset
            want = self._expected(tp, generation)
            if want is not None and offset < want:
                continue
            if want is not None and offset > want and not self.gaps_possible():
                await self._back(tp, want, offset)
                continue
            out.append(event)
            self.expected[tp] = offset + 1
            self.since[tp] = self.read_in[tp] = generation
        return out

    async def audit(self, topic: str) -> None:
        """While the runner waits for records: a position past the expected
        offset at two looks in a row, with nothing read between, means the
        partition's last records were fetched and dropped (at one look, they
        may be on their way)."""
        consumer = self.app.consumer
        for tp in [tp for tp in consumer.assignment() if tp.topic == topic]:
            if self.app.rebalancing:  # the assignment's own seek decides where it reads
                return
            generation = self.app.consumer_generation_id
            if (want := self._expected(tp, generation)) is None:
                continue
            position = await consumer.position(tp)
            looked, self.looked[tp] = self.looked.get(tp), (generation, want, position)
            if position is None or position <= want or generation != self.app.consumer_generation_id \
                    or looked != (generation, want, position):
                continue
            if self.gaps_possible() and self.sought_to.get(tp) == want:
                self.expected[tp] = position  # sought back once, and nothing came: transaction markers
            else:
                self.sought_to.pop(tp, None)  # sought back before, and dropped again: once more
                await self._back(tp, want, position)

    async def _back(self, tp, want: int, seen: int) -> None:
        """Seek `tp` back to `want`, once: the records read before the seek
        lands are dropped until `want` comes again."""
        if self.sought_to.get(tp) == want:
            return
        consumer, generation = self.app.consumer, self.app.consumer_generation_id
        want = max(want, (await consumer.earliest_offsets(tp)).get(tp) or 0)
        if generation != self.app.consumer_generation_id or self.app.rebalancing:
            return  # a rebalance came meanwhile: its seek decides, from the last commit
        log.warning("%s[%d]: records %d–%d were fetched but never reached the pipeline: read again",
                    tp.topic, tp.partition, want, seen - 1)
        self.sought_to[tp] = self.expected[tp] = want
        await consumer.seek(tp, want)
