"""The pipeline: one Faust agent per input topic, each a thin runner of the
roles over a batch (see each module). Agents are named as the topics they read."""

from __future__ import annotations

from streams.worker.pipeline.episodes import EpisodesPipeline
from streams.worker.pipeline.reflections import ReflectionsPipeline
from streams.worker.pipeline.requests import RequestsPipeline
from streams.worker.runtime import Runtime


def install(runtime: Runtime) -> None:
    app, outlets = runtime.app, runtime.outlets
    for topic, runner in ((outlets.episodes, EpisodesPipeline), (outlets.reflections, ReflectionsPipeline),
                          (outlets.requests, RequestsPipeline)):
        app.agent(topic, name=topic.get_topic_name())(runner(runtime).run)
