from __future__ import annotations

from pathlib import Path

import pytest

from streams.settings import SPECS, Settings, SettingsError


def test_defaults_are_valid_and_documented_in_the_readme():
    s = Settings.load(env={})
    assert s.broker == "kafka://127.0.0.1:9092" and s.partitions == 4 and s.qdrant_url is None
    assert s.threshold == 15.0 and s.min_episodes == 50 and s.top_k == 8 and s.max_depth == 2
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    for spec in SPECS:
        assert f"`{spec.env}`" in readme and spec.flag in readme, spec.env


def test_environment_then_flags():
    s = Settings.load(env={"REFLECT_PARTITIONS": "8", "REFLECT_BROKER": "h1:9093,h2:9094"})
    assert s.partitions == 8 and s.bootstrap == "h1:9093,h2:9094"
    assert Settings.load(env={"REFLECT_PARTITIONS": "8"}, partitions=2).partitions == 2


@pytest.mark.parametrize("env,flag,named", [
    ({"REFLECT_PARTITIONS": "zero"}, {}, "REFLECT_PARTITIONS"),
    ({"REFLECT_PARTITIONS": "0"}, {}, "REFLECT_PARTITIONS"),
    ({}, {"salience_cut": "1.5"}, "--salience-cut"),
    ({"REFLECT_BROKER": "http://x:1"}, {}, "REFLECT_BROKER"),
    ({"REFLECT_REASONER": "gpt"}, {}, "REFLECT_REASONER"),
    ({"REFLECT_QDRANT_URL": "localhost:6333"}, {}, "REFLECT_QDRANT_URL"),
    ({"REFLECT_TOPIC_EPISODES": "bad name"}, {}, "REFLECT_TOPIC_EPISODES"),
])
def test_a_wrong_value_fails_naming_the_setting(env, flag, named):
    with pytest.raises(SettingsError, match=named):
        Settings.load(env=env, **flag)
