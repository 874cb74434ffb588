"""A bare Faust worker: the framework's own limit, the baseline of ingest.

Run as a child by tests/benchmarks/ingest.py:
    python tests/benchmarks/bare_agent.py BROKER TOPIC PORT PARTITIONS DATADIR [table|agents=N]

One agent on TOPIC that only counts events (with `table`, it also writes a
one-key-per-user table on every event, as a per-event accumulator would; with
`agents=N`, N agents read the topic, as the worker's projector, accumulator
and invalidator do, and an event counts once all N have seen it); GET /count
on PORT answers how many it has seen. Same Faust settings as Reflect's worker
(at-least-once, producer batch of 1, short session).
"""

from __future__ import annotations

import sys

import faust


def main(broker: str, topic: str, port: int, partitions: int, datadir: str, with_table: bool,
         agents: int = 1) -> None:
    app = faust.App(f"bare-{topic}", broker=broker, store="memory://", autodiscover=False, datadir=datadir,
                    topic_partitions=partitions, processing_guarantee="at_least_once",
                    producer_max_batch_size=1, broker_session_timeout=6.0, broker_heartbeat_interval=1.0,
                    consumer_auto_offset_reset="earliest", key_serializer="json", value_serializer="json",
                    web_host="127.0.0.1", web_port=port, web_in_thread=False)
    source = app.topic(topic, value_serializer="raw", key_serializer="raw", partitions=partitions)
    table = app.Table("seen", default=int, partitions=partitions) if with_table else None
    seen = {"n": 0}
    each = [0] * agents

    async def count(stream, index: int):
        async for event in stream.events():
            each[index] += 1
            seen["n"] = min(each)
            if table is not None:
                user = event.message.key.decode()
                table[user] += 1

    for index in range(agents):
        app.agent(source, name=f"count-{index}")(lambda stream, index=index: count(stream, index))

    @app.page("/count")
    async def answer(web, request):
        return web.json(seen)

    worker = faust.Worker(app, loglevel="warning", quiet=True, redirect_stdouts=False)
    worker.execute_from_commandline()


if __name__ == "__main__":
    broker, topic, port, partitions = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    option = sys.argv[6] if len(sys.argv) > 6 else "-"
    main(broker, topic, port, partitions, sys.argv[5], option == "table",
         int(option.split("=")[1]) if option.startswith("agents=") else 1)
