"""The HTTP API's old home: its routes live in `streams.http.routes`, one module per
resource; these names stay importable from here for the app and the tests."""

from streams.http.routes import install
from streams.http.routes.beliefs import belief, live_beliefs
from streams.http.routes.common import ApiError, keys_for, web_options

__all__ = ["ApiError", "belief", "install", "keys_for", "live_beliefs", "web_options"]
