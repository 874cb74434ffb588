"""The polars → pandas story of issue 24, as episodes: eight of Dana
preferring polars over pandas (one cycle forms beliefs about it), then ten
that say her preference turned, or ten that agree, or ten about other things.
Valid times one hour apart from 2026-03-02 09:00 UTC."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from schemas import EpisodeRecorded

USER = "dana"
THRESHOLD, MIN_EPISODES = 4.0, 8  # the eighth polars episode fires the first cycle (8 × 0.6)
POLARS = [
    "Dana chose polars over pandas for the weekly reporting job.",
    "Dana rewrote the churn notebook from pandas to polars; she prefers polars.",
    "Dana asked for polars instead of pandas in the new ingestion script.",
    "Dana said polars is faster than pandas for the reporting queries.",
    "Dana reviewed a pull request and asked to replace pandas with polars.",
    "Dana prefers polars dataframes; pandas feels slow to her.",
    "Dana set polars as the default dataframe library for reporting.",
    "Dana migrated the sales dashboard from pandas to polars.",
]
PANDAS = [
    "Dana switched the reporting back to pandas; she no longer wants polars.",
    "Dana told the team to stop using polars and go back to pandas.",
    "Dana moved the churn notebook back to pandas instead of polars.",
    "Dana no longer uses polars for the dashboards; pandas is the standard again.",
    "Dana dropped polars from the ingestion script and returned to pandas.",
    "Dana asked to replace polars with pandas in the sales dashboard.",
    "Dana went back to pandas for the weekly reporting job, away from polars.",
    "Dana chose pandas over polars for the new reporting queries.",
    "Dana stopped using polars in the billing export; pandas again.",
    "Dana migrated the ingestion script from polars to pandas.",
]
AGAIN = [
    "Dana again picked polars over pandas for the quarterly reporting.",
    "Dana ported the billing export from pandas to polars.",
    "Dana asked for polars instead of pandas in the forecasting notebook.",
    "Dana chose polars over pandas for the churn reporting queries.",
    "Dana migrated the inventory report from pandas to polars.",
    "Dana prefers polars for the new reporting job, not pandas.",
    "Dana replaced pandas with polars in the ingestion tests.",
    "Dana set polars as the dataframe library of the export service.",
    "Dana kept polars over pandas in the dashboard rewrite.",
    "Dana asked to use polars instead of pandas for the audit report.",
]
OTHER = [
    "Dana booked a flight to Lisbon for the conference.",
    "The CI pipeline for billing finished green in 4 minutes.",
    "Dana watered the office plants.",
    "Dana joined the sprint retro; two tickets were reprioritised.",
    "Bumped httpx to the latest minor version in webhooks.",
    "Dana renamed a helper in the geocoding module.",
    "Dana updated the onboarding documentation for new hires.",
    "Dana fixed a typo in an error message of the scheduler.",
    "Lunch was a long one; the team celebrated a birthday.",
    "Dana reviewed the quarterly roadmap with her manager.",
]
START = datetime(2026, 3, 2, 9, tzinfo=timezone.utc)


def at(hour: int) -> str:
    return (START + timedelta(hours=hour)).strftime("%Y-%m-%dT%H:%M:%SZ")


def episodes(texts: list[str], first: int, prefix: str, user: str = USER) -> list[EpisodeRecorded]:
    """`texts` as episodes of `user`, ids prefix-1…, one hour apart from hour `first`."""
    return [EpisodeRecorded(user_id=user, episode_id=f"{prefix}-{i}", text=text, importance=0.6,
                            occurred_at=at(first + i)) for i, text in enumerate(texts, start=1)]


def story(then: list[str], prefix: str) -> list[EpisodeRecorded]:
    return episodes(POLARS, 0, "polars") + episodes(then, 24, prefix)


def spaced(texts, prefix, first_day):
    """Dana's episodes of `texts`, one a day from `first_day` days after START."""
    return [EpisodeRecorded(user_id=USER, episode_id=f"{prefix}-{i}", text=t, importance=0.6,
                            occurred_at=(START + timedelta(days=first_day + i)).strftime("%Y-%m-%dT%H:%M:%SZ"))
            for i, t in enumerate(texts, start=1)]
