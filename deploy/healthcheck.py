"""Container health check: exit 0 when the worker's /healthz answers 200, else 1.

The image's HEALTHCHECK and compose run it (Kubernetes probes /healthz over
HTTP itself). Standard library only: python:3.12-slim has no curl or wget.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request


def main() -> int:
    host = os.environ.get("REFLECT_WEB_HOST", "")
    # A wildcard bind address is not an address to connect to: use loopback.
    host = "127.0.0.1" if host in ("", "0.0.0.0", "::") else host
    port = os.environ.get("REFLECT_WEB_PORT", "6066")
    url = f"http://{host}:{port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=3) as answer:
            status = answer.status
    except urllib.error.HTTPError as exc:  # 503 while partitions are assigned or tables recover
        status = exc.code
    except (urllib.error.URLError, OSError) as exc:
        print(f"{url}: {exc}")
        return 1
    print(f"{url}: {status}")
    return 0 if status == 200 else 1


if __name__ == "__main__":
    sys.exit(main())
