"""`reflect worker` whose view fails while a flag file exists: every call then
raises, as an engine that is down raises its own errors. The real Qdrant Edge
view does the work otherwise; only the outage is injected.

    python tests/support/faulty_worker.py   (REFLECT_TEST_VIEW_DOWN=<flag file>)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from streams.cli.main import main  # noqa: E402
import streams.worker.app  # noqa: E402

FLAG = Path(os.environ["REFLECT_TEST_VIEW_DOWN"])


class DownWhileFlagged:
    def __init__(self, view) -> None:
        self._view = view

    def __getattr__(self, name: str):
        attribute = getattr(self._view, name)
        if not callable(attribute) or name in ("close", "name"):
            return attribute

        def call(*args, **kwargs):
            if FLAG.exists():
                raise RuntimeError("injected: the view is down")
            return attribute(*args, **kwargs)
        return call


real_open_view = streams.worker.app.open_view
streams.worker.app.open_view = lambda settings, dim: DownWhileFlagged(real_open_view(settings, dim))

if __name__ == "__main__":
    sys.exit(main(["worker"]))
