"""Every setting in one place: environment variable, CLI flag, default, check.

`Settings.load(env, overrides)` reads ``REFLECT_*`` variables, applies CLI
overrides on top, and fails with a message naming the setting (its variable
and flag) when a value is wrong, so a misconfigured worker never starts.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, Mapping

from processors.tenants import DELIMITERS


class SettingsError(ValueError):
    pass


def _positive_int(raw: str) -> int:
    value = int(raw)
    if value < 1:
        raise ValueError("must be ≥ 1")
    return value


def _positive_float(raw: str) -> float:
    value = float(raw)
    if not value > 0:
        raise ValueError("must be > 0")
    return value


def _non_negative_float(raw: str) -> float:
    value = float(raw)
    if not 0 <= value < float("inf"):
        raise ValueError("must be a finite number >= 0")
    return value


def _unit(raw: str) -> float:
    value = float(raw)
    if not 0.0 <= value <= 1.0:
        raise ValueError("must be within 0..1")
    return value


def _broker(raw: str) -> str:
    # kafka://host:port[,host:port...]; a bare host:port gets the scheme.
    url = raw if "://" in raw else f"kafka://{raw}"
    scheme, _, hosts = url.partition("://")
    if scheme != "kafka" or not all(re.fullmatch(r"[\w.\-\[\]:]+:\d{1,5}", h) for h in hosts.split(",")):
        raise ValueError("expected kafka://host:port[,host:port]")
    return url


def _count(raw: str) -> int:
    value = int(raw)
    if value < 0:
        raise ValueError("must be 0 or more")
    return value


def _model(raw: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9._:@-]{1,200}", raw):
        raise ValueError("a model name is 1–200 of [A-Za-z0-9._:@-]")
    return raw


def _topic(raw: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,200}", raw):
        raise ValueError("a topic name is 1–200 of [A-Za-z0-9._-]")
    return raw


def _choice(*options: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        if raw not in options:
            raise ValueError(f"expected one of {', '.join(options)}")
        return raw

    return parse


def _prices(raw: str) -> tuple[float, ...] | None:
    if raw == "":
        return None
    try:
        prices = tuple(float(x) for x in raw.split(","))
    except ValueError:
        prices = ()
    if len(prices) != 4 or any(p < 0 for p in prices):
        raise ValueError("expected four USD-per-million-token prices: input,output,cache_write,cache_read")
    return prices


class Secret(str):
    """A setting's secret value: itself wherever a str is used (clients, a child's
    environment), masked wherever it is shown (`reflect settings`, a logged
    Settings), so a password never reaches a terminal or a log by accident."""

    def __repr__(self) -> str:
        return "'***'"


def _secret(raw: str) -> Secret | None:
    return Secret(raw) if raw else None


def _optional(raw: str) -> str | None:
    return raw or None


def _optional_replay(raw: str) -> str | None:
    if raw and not re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,39}", raw):
        raise ValueError("a replay's name is 1 to 40 of a-z 0-9 _ -, starting with a letter or digit")
    return raw or None


def _api_token(raw: str) -> Secret | None:
    # RFC 6750 b64token characters, so it fits an Authorization header as is;
    # 16 characters at least: a guessable token protects nothing.
    if raw == "":
        return None
    if not re.fullmatch(r"[A-Za-z0-9._~+/-]{16,4096}=*", raw):
        raise ValueError("expected 16–4096 of [A-Za-z0-9._~+/-] (e.g. `openssl rand -hex 32`)")
    return Secret(raw)


def _auth_secret(raw: str) -> Secret | None:
    # HS256 is only as strong as its secret: 32 bytes at least (RFC 7518 §3.2).
    if raw == "":
        return None
    if len(raw.encode()) < 32:
        raise ValueError("an HS256 secret needs 32 bytes at least (e.g. `openssl rand -hex 32`)")
    return Secret(raw)


def _public_key_file(raw: str) -> str | None:
    # Read and typed at start-up: a key nobody can verify with must stop the worker, not every request.
    path = _file(raw)
    if path is not None:
        from streams.auth import algorithm_of, public_key_from

        algorithm_of(public_key_from(path))
    return path


def _flag(raw: str) -> bool:
    value = raw.lower()
    if value not in ("", "0", "1", "false", "true", "no", "yes", "off", "on"):
        raise ValueError("expected true or false")
    return value in ("1", "true", "yes", "on")


def _optional_score(raw: str) -> float | None:
    """A hybrid recall score: (cosine + BM25 share ≤ 1) × boost ≤ 1.2, so 0..2.4."""
    if raw == "":
        return None
    value = float(raw)
    if not 0.0 <= value <= 2.4:
        raise ValueError("a hybrid score is within 0..2.4")
    return value


def _optional_cosine(raw: str) -> float | None:
    if raw == "":
        return None
    value = float(raw)
    if not -1.0 <= value <= 1.0:
        raise ValueError("a cosine is within -1..1")
    return value


def _file(raw: str) -> str | None:
    if raw == "":
        return None
    if not Path(raw).is_file():
        raise ValueError("no such file")
    return raw


def _host(raw: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9.\-:\[\]]{1,255}", raw):
        raise ValueError("expected a host name or IP address, e.g. 127.0.0.1 or 0.0.0.0")
    return raw


def _level(raw: str) -> str:
    return _choice("debug", "info", "warning", "error", "critical")(raw.lower())


def _ttl(raw: str) -> int:
    # A duration as `reflect token mint --ttl` takes it; 0: no limit.
    from streams.auth import seconds_of

    return 0 if raw.strip() == "0" else seconds_of(raw)


def _optional_url(raw: str) -> str | None:
    if raw == "":
        return None
    if not re.match(r"https?://", raw):
        raise ValueError("expected http(s)://host:port")
    return raw.rstrip("/")


@dataclass(frozen=True)
class Spec:
    name: str
    env: str
    default: str
    parse: Callable[[str], Any]
    doc: str

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def switch(self) -> bool:
        """A yes/no setting: its flag takes no value (`--insecure-no-auth`)."""
        return self.parse is _flag


UP_PORT = 8080  # the API port of `reflect up`, where the CLI's reads and the client look by default
UP_API = f"http://127.0.0.1:{UP_PORT}"
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

SPECS: tuple[Spec, ...] = (
    Spec("broker", "REFLECT_BROKER", "kafka://127.0.0.1:9092", _broker,
         "Kafka bootstrap servers (kafka://host:port[,host:port])."),
    Spec("app_id", "REFLECT_APP_ID", "reflect", _topic,
         "Faust application id: consumer group and prefix of its changelog topics."),
    Spec("partitions", "REFLECT_PARTITIONS", "4", _positive_int,
         "Partitions of every Reflect topic (all keyed by user_id)."),
    Spec("replication_factor", "REFLECT_REPLICATION_FACTOR", "1", _positive_int,
         "Replication factor used when creating topics."),
    Spec("min_insync_replicas", "REFLECT_MIN_INSYNC_REPLICAS", "1", _positive_int,
         "min.insync.replicas of the topics Reflect creates: replicas that must have an acks=all write before "
         "it counts (at most the replication factor; 2 with 3 replicas survives one broker lost)."),
    Spec("allow_finite_retention", "REFLECT_ALLOW_FINITE_RETENTION", "false", _flag,
         "true: start although a topic of record (episodes, reflections) has a finite retention.ms or "
         "retention.bytes or is compacted (refused otherwise: a rebuild replays them from the start)."),
    Spec("broker_security_protocol", "REFLECT_BROKER_SECURITY_PROTOCOL", "PLAINTEXT",
         _choice(*SECURITY_PROTOCOLS),
         "How every Kafka client of Reflect talks to the broker: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL."),
    Spec("broker_sasl_mechanism", "REFLECT_BROKER_SASL_MECHANISM", "PLAIN", _choice(*SASL_MECHANISMS),
         "SASL mechanism with SASL_*: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512."),
    Spec("broker_sasl_username", "REFLECT_BROKER_SASL_USERNAME", "", _optional,
         "SASL user name (required with SASL_*)."),
    Spec("broker_sasl_password", "REFLECT_BROKER_SASL_PASSWORD", "", _secret,
         "SASL password (required with SASL_*; never printed)."),
    Spec("broker_ssl_cafile", "REFLECT_BROKER_SSL_CAFILE", "", _file,
         "CA bundle that signs the broker's certificate with SSL / SASL_SSL (empty: the system's CAs)."),
    Spec("broker_ssl_certfile", "REFLECT_BROKER_SSL_CERTFILE", "", _file,
         "Client certificate (PEM) for mutual TLS with SSL / SASL_SSL."),
    Spec("broker_ssl_keyfile", "REFLECT_BROKER_SSL_KEYFILE", "", _file,
         "Private key of broker_ssl_certfile, if it is not in that file."),
    Spec("processing_guarantee", "REFLECT_PROCESSING_GUARANTEE", "at_least_once",
         _choice("at_least_once", "exactly_once"),
         "Faust's processing guarantee. exactly_once needs Apache Kafka (transactions): it fails on the "
         "embedded Tansu (InitProducerId)."),
    Spec("topic_episodes", "REFLECT_TOPIC_EPISODES", "episodes", _topic,
         "Topic of EpisodeRecorded / EpisodeRetracted."),
    Spec("topic_requests", "REFLECT_TOPIC_REQUESTS", "reflection-requests", _topic,
         "Topic of ReflectionRequested."),
    Spec("topic_reflections", "REFLECT_TOPIC_REFLECTIONS", "reflections", _topic,
         "Topic of ReflectionCreated / Reinforced / Invalidated / CycleCompleted."),
    Spec("data_dir", "REFLECT_DATA_DIR", ".reflect", str,
         "Directory of the embedded view (Qdrant Edge shards) and local state."),
    Spec("seal", "REFLECT_SEAL", "on", _choice("on", "off"),
         "Crypto-shredding: an episode's text, source and metadata go on the log sealed (AES-256-GCM) under "
         "a data key of the episode's own, kept on the key topic; an erasure destroys it. Off: in clear."),
    Spec("scrub", "REFLECT_SCRUB", "on", _choice("on", "off"),
         "After an erasure or a forget, the embedded view is written point by point into a fresh shard and "
         "swapped in, so that no file under the data directory keeps the erased text (a shard's WAL and "
         "payload pages do until it is dropped). Off: until the next rebuild or compaction."),
    Spec("master_keys", "REFLECT_MASTER_KEYS", "", _optional,
         "The master key ring that wraps every data key: a file of `id:base64` lines, the first current. "
         "Empty: data_dir/master.keys, made on first use. Back it up apart from the data it unlocks."),
    Spec("qdrant_url", "REFLECT_QDRANT_URL", "", _optional_url,
         "Qdrant server URL; empty means the embedded Qdrant Edge view in data_dir."),
    Spec("qdrant_api_key", "REFLECT_QDRANT_API_KEY", "", _secret,
         "API key of the Qdrant server (empty: QDRANT_API_KEY, else none)."),
    Spec("view", "REFLECT_VIEW", "reflect", _topic,
         "Stable name of the view (Qdrant alias / Edge active shard) that reads use."),
    Spec("compact_growth", "REFLECT_COMPACT_GROWTH", "0.5", _non_negative_float,
         "Share by which an embedded view may grow past its size when last optimized before the worker "
         "compacts it: an optimized copy swapped in, reads served meanwhile (streams/worker/compaction.py; 0: never)."),
    Spec("compact_min_points", "REFLECT_COMPACT_MIN_POINTS", "50000", _positive_int,
         "Points an embedded view must hold before it is first compacted (a small view reads fast as it is)."),
    Spec("embedder", "REFLECT_EMBEDDER", "hashing", _choice("hashing", "minilm", "e5-small"),
         "hashing: offline feature hashing; minilm: all-MiniLM-L6-v2 int8 ONNX (the minilm extra); "
         "e5-small: multilingual-e5-small 4-bit (the e5 extra; see processors/README.md, \"Embedders\"). A view "
         "refuses another embedder than the one that built it: `reflect rebuild` switches."),
    Spec("projector_batch", "REFLECT_PROJECTOR_BATCH", "256", _positive_int,
         "Most episodes the projector embeds and upserts in one batch."),
    Spec("projector_within", "REFLECT_PROJECTOR_WITHIN", "0.05", _positive_float,
         "Seconds the projector waits to fill a batch before flushing what it has."),
    Spec("session_timeout", "REFLECT_SESSION_TIMEOUT", "6.0", _positive_float,
         "Consumer group session timeout in seconds (short: Tansu holds joins for half of it; Kafka refuses "
         "less than its group.min.session.timeout.ms, 6 s by default)."),
    Spec("rebalance_timeout", "REFLECT_REBALANCE_TIMEOUT", "60.0", _positive_float,
         "Seconds a rebalance waits for every known member to rejoin (Faust's default; some brokers wait it "
         "out for a member that died, so a restart after a crash takes this long)."),
    Spec("fetch_wait", "REFLECT_FETCH_WAIT", "0.05", _positive_float,
         "Seconds a worker's fetch may wait for records (Faust's 1.5 s costs ~0.6 s a hop on Tansu)."),
    Spec("web_host", "REFLECT_WEB_HOST", "127.0.0.1", _host,
         "Interface the worker's HTTP API listens on (0.0.0.0 in a container)."),
    Spec("web_port", "REFLECT_WEB_PORT", "6066", _positive_int,
         "Port of the worker's HTTP API."),
    Spec("advertised_url", "REFLECT_ADVERTISED_URL", "", _optional_url,
         "URL the other workers reach this one's API at, to forward a user's reads to the worker that owns its "
         "partition (empty: `http://<web_host>:<web_port>`, the host name when web_host is 0.0.0.0)."),
    Spec("api_token", "REFLECT_API_TOKEN", "", _api_token,
         "Shared bearer token: an admin credential for every user and route but /healthz and /livez, /metrics "
         "included (empty: none)."),
    Spec("auth_secret", "REFLECT_AUTH_SECRET", "", _auth_secret,
         "HS256 secret (32 bytes at least) that signs per-user tokens (`reflect token mint`) and verifies them; "
         "never printed."),
    Spec("auth_previous_secret", "REFLECT_AUTH_PREVIOUS_SECRET", "", _auth_secret,
         "The HS256 secret being rotated out: tokens it signed are still accepted (needs `REFLECT_AUTH_SECRET`)."),
    Spec("auth_public_key_file", "REFLECT_AUTH_PUBLIC_KEY_FILE", "", _public_key_file,
         "PEM public key that verifies per-user tokens signed elsewhere: RSA → RS256, EC P-256 → ES256."),
    Spec("auth_previous_public_key_file", "REFLECT_AUTH_PREVIOUS_PUBLIC_KEY_FILE", "", _public_key_file,
         "The public key being rotated out: tokens it verifies are still accepted (needs "
         "`REFLECT_AUTH_PUBLIC_KEY_FILE`)."),
    Spec("insecure_no_auth", "REFLECT_INSECURE_NO_AUTH", "false", _flag,
         "true: start with no credential configured although `REFLECT_WEB_HOST` is not a loopback address "
         "(refused otherwise)."),
    Spec("auth_audience", "REFLECT_AUTH_AUDIENCE", "", _optional,
         "The `aud` a per-user token must name (empty: not checked)."),
    Spec("auth_issuer", "REFLECT_AUTH_ISSUER", "", _optional,
         "The `iss` a per-user token must name (empty: not checked)."),
    Spec("auth_max_ttl", "REFLECT_AUTH_MAX_TTL", "30d", _ttl,
         "Longest lifetime (`exp` − `iat`, or `exp` − now without `iat`) of a per-user token this worker "
         "accepts: 90s, 15m, 1h, 30d (0: no limit). `reflect token mint` refuses a longer `--ttl`."),
    Spec("cluster_secret", "REFLECT_CLUSTER_SECRET", "", _auth_secret,
         "Secret (32 bytes at least) that signs the short-lived assertion a worker forwards a read with, "
         "instead of the caller's token (empty: derived from `REFLECT_AUTH_SECRET` or `REFLECT_API_TOKEN`; "
         "needed when only a public key verifies tokens)."),
    Spec("web_tls_cert_file", "REFLECT_WEB_TLS_CERT_FILE", "", _file,
         "PEM certificate (chain) the HTTP API serves TLS with (with `REFLECT_WEB_TLS_KEY_FILE`; empty: plain "
         "HTTP). The advertised URL is then https."),
    Spec("web_tls_key_file", "REFLECT_WEB_TLS_KEY_FILE", "", _file,
         "PEM private key of `REFLECT_WEB_TLS_CERT_FILE`."),
    Spec("cluster_ca_file", "REFLECT_CLUSTER_CA_FILE", "", _file,
         "PEM CA bundle that verifies the other workers' TLS certificates on forwarded reads (empty: the "
         "system's)."),
    Spec("rate_limit", "REFLECT_RATE_LIMIT", "0", _non_negative_float,
         "Requests per second one credential may make to one worker (a token bucket, `/healthz` and `/livez` "
         "not counted); past it, 429 with Retry-After (0: no limit)."),
    Spec("rate_burst", "REFLECT_RATE_BURST", "0", _count,
         "Requests one credential may make at once before `REFLECT_RATE_LIMIT` paces it (0: twice the limit, "
         "at least 1)."),
    Spec("max_request_bytes", "REFLECT_MAX_REQUEST_BYTES", "1048576", _positive_int,
         "Largest request body the API reads; a larger one is answered 413."),
    Spec("log_format", "REFLECT_LOG_FORMAT", "text", _choice("text", "json"),
         "text: Faust's console lines; json: one JSON object per line (time, level, logger, message, context)."),
    Spec("log_level", "REFLECT_LOG_LEVEL", "info", _level,
         "debug, info, warning, error or critical."),
    Spec("tracing", "REFLECT_TRACING", "off", _choice("off", "on"),
         "on: OpenTelemetry spans around cycles and projector batches (needs opentelemetry-api and an SDK "
         "to export them)."),
    Spec("reasoner", "REFLECT_REASONER", "offline", _choice("offline", "anthropic"),
         "Reasoner of the reflection loop (anthropic needs ANTHROPIC_API_KEY; ANTHROPIC_BASE_URL is honoured)."),
    Spec("anthropic_model", "REFLECT_ANTHROPIC_MODEL", "claude-haiku-4-5", _model,
         "Model of the anthropic reasoner."),
    Spec("prompts", "REFLECT_PROMPTS", "", _optional,
         "A folder holding the anthropic reasoner's prompts (the four files of streams/adapters/prompts/, "
         "the same names); empty: the packaged ones. Beliefs carry the set's version, a hash of its files."),
    Spec("prompt_library", "REFLECT_PROMPT_LIBRARY", "", _optional,
         "A folder of prompt sets, one per subfolder, that `reflect replay --prompt-version` chooses from "
         "(by version or folder name, besides the packaged set and `prompts`); empty: data_dir/prompts."),
    Spec("reasoner_timeout", "REFLECT_REASONER_TIMEOUT", "30.0", _positive_float,
         "Seconds one reasoner call may take before it fails."),
    Spec("reasoner_retries", "REFLECT_REASONER_RETRIES", "2", _count,
         "Retries (with the SDK's backoff) of a reasoner call on 429/5xx/529 and timeouts."),
    Spec("reasoner_batch", "REFLECT_REASONER_BATCH", "batched", _choice("batched", "per-question"),
         "batched: one call for the insights of all a cycle's questions; per-question: one call each."),
    Spec("anthropic_price", "REFLECT_ANTHROPIC_PRICE", "", _prices,
         "input,output,cache_write,cache_read USD per million tokens; empty: the list price of the model."),
    Spec("user_daily_tokens", "REFLECT_USER_DAILY_TOKENS", "200000", _count,
         "Tokens one user's cycles may spend per UTC day (0: no limit, explicitly)."),
    Spec("daily_tokens", "REFLECT_DAILY_TOKENS", "5000000", _count,
         "Tokens all cycles may spend per UTC day, split evenly over partitions (0: no limit, explicitly)."),
    Spec("tenant_daily_tokens", "REFLECT_TENANT_DAILY_TOKENS", "1000000", _count,
         "Tokens one tenant's cycles may spend per UTC day, split evenly over partitions like "
         "`REFLECT_DAILY_TOKENS`, so users of one tenant never spend another's share of a partition "
         "(0: no limit, explicitly)."),
    Spec("tenant_delimiter", "REFLECT_TENANT_DELIMITER", ":", _choice(*DELIMITERS),
         "A user id's tenant is its part before the first of this character (`acme:1` → `acme`); an id "
         "without one is a tenant of its own."),
    Spec("breaker_failures", "REFLECT_BREAKER_FAILURES", "3", _positive_int,
         "Consecutive cycles the API fails (after retries) before the breaker opens."),
    Spec("breaker_cooldown", "REFLECT_BREAKER_COOLDOWN", "60.0", _positive_float,
         "Seconds an open breaker fails cycles fast before it lets one call try again."),
    Spec("refresh", "REFLECT_REFRESH", "concurrent", _choice("concurrent", "blocking"),
         "Default refresh policy of reads: serve the view as is, or wait for a due cycle's beliefs."),
    Spec("refresh_timeout", "REFLECT_REFRESH_TIMEOUT", "10.0", _positive_float,
         "Seconds a blocking read waits for due cycles before it answers, saying it is stale."),
    Spec("recall_min_score", "REFLECT_RECALL_MIN_SCORE", "", _optional_score,
         "Hybrid score (cosine + BM25 share, boosted) a live belief needs to be served for a pattern question, "
         "ranked together with the episodes (else episodes only); empty: the embedder's own, minilm and hashing "
         "0.3, e5-small 0.96."),
    Spec("grounding_min_cosine", "REFLECT_GROUNDING_MIN_COSINE", "", _optional_cosine,
         "Cosine a cited item needs to support a new belief by meaning; an insight with fewer than "
         "`REFLECT_CITATION_FLOOR` such items (instruction-shaped items not counted) is dropped, the reason in "
         "its cycle's audit event (empty: the embedder's own, minilm 0.35, e5-small 0.85, hashing 0.05 — word "
         "overlap only)."),
    Spec("challenge", "REFLECT_CHALLENGE", "off", _choice("on", "off"),
         "The contradiction gate: new episodes that bear on a live belief ask for a challenge cycle whose "
         "verdict is holds (reinforced), refined or contradicted (superseded). Off by default for now: see "
         "processors/README.md, \"Contradictions and staleness\"."),
    Spec("challenge_min_score", "REFLECT_CHALLENGE_MIN_SCORE", "", _optional_cosine,
         "Cosine, to a belief's text or to the nearest evidence it cites, at which an episode challenges the "
         "belief (empty: the embedder's own, minilm 0.6, hashing 0.32 — word overlap only)."),
    Spec("challenge_quorum", "REFLECT_CHALLENGE_QUORUM", "3", _positive_int,
         "Episodes bearing on one belief at which it is challenged (a belief resting on more evidence waits "
         "for half its support, at most 16); until then its challengers wait."),
    Spec("challenge_daily", "REFLECT_CHALLENGE_DAILY", "10", _positive_int,
         "Challenge cycles one user may be asked per day of the user's valid time (UTC, so a replay counts "
         "the same), each belief once a day; the rest wait for a later day. Challenge cycles also count "
         "against the token budgets."),
    Spec("stale_after_days", "REFLECT_STALE_AFTER_DAYS", "0", _non_negative_float,
         "Days of the user's valid time (the latest `occurred_at` of the user's episodes) past a belief's "
         "newest support after which the belief is stale: served only with `include=stale`, never pinned, "
         "revalidated over its evidence and the user's recent window (0: never)."),
    Spec("threshold", "REFLECT_THRESHOLD", "15.0", _positive_float,
         "Summed importance since the last cycle that triggers a reflection."),
    Spec("min_episodes", "REFLECT_MIN_EPISODES", "50", _positive_int,
         "High-salience episodes a user needs in total before any cycle runs."),
    Spec("salience_cut", "REFLECT_SALIENCE_CUT", "0.5", _unit,
         "Importance at or above which an episode counts as high-salience."),
    Spec("top_k", "REFLECT_TOP_K", "8", _positive_int,
         "Evidence items retrieved per salient question."),
    Spec("max_depth", "REFLECT_MAX_DEPTH", "2", _positive_int,
         "Deepest reflection allowed (beliefs about beliefs)."),
    Spec("citation_floor", "REFLECT_CITATION_FLOOR", "2", _positive_int,
         "Fewest valid citations an insight needs to be kept."),
    Spec("replay", "REFLECT_REPLAY", "", _optional_replay,
         "Set by `reflect replay` on the side worker it starts, never by hand: the replay's name. That worker "
         "reads `episodes` as the replay's spec (data_dir/replay.json) says, takes no writes, and publishes "
         "only to the replay's own topics."),
    Spec("replay_stall", "REFLECT_REPLAY_STALL", "900", _positive_float,
         "Seconds a replay may go without progress (its side worker's commits unchanged) before it is marked "
         "failed and its side worker stopped, so a hung one does not hold the one replay slot for good; time "
         "the side worker waits for a core (at nice 19, behind a busy live worker) does not count."),
)


# deploy/README.md's "Configuration" table is written from SPECS between these
# markers (`reflect settings --markdown deploy/README.md`), so it cannot drift.
TABLE_BEGIN = "<!-- settings:begin -->"
TABLE_END = "<!-- settings:end -->"
TABLE_DOC = "deploy/README.md"


def markdown_table(specs: tuple[Spec, ...] = SPECS) -> str:
    """The settings as a Markdown table: variable, flag, default, meaning."""
    rows = ["| variable | flag | default | meaning |", "| --- | --- | --- | --- |"]
    rows += [f"| `{s.env}` | `{s.flag}` | {_shown_default(s.default)} | {_cell(s.doc)} |" for s in specs]
    return "\n".join(rows) + "\n"


def _shown_default(default: str) -> str:
    return f"`{default}`" if default else "(empty)"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")  # a bare | would end the cell


def with_markdown_table(doc: str, table: str) -> str:
    """`doc` with what stands between its table markers replaced by `table`."""
    if doc.count(TABLE_BEGIN) != 1 or doc.count(TABLE_END) != 1 or doc.index(TABLE_BEGIN) > doc.index(TABLE_END):
        raise ValueError(f"expected one {TABLE_BEGIN} line, then one {TABLE_END} line")
    head, rest = doc.split(TABLE_BEGIN)
    tail = rest.split(TABLE_END)[1]
    return f"{head}{TABLE_BEGIN}\n\n{table}\n{TABLE_END}{tail}"  # blank lines: a table is its own block


def _named(*names: str) -> str:
    by_name = {spec.name: spec for spec in SPECS}
    return ", ".join(f"{n} ({by_name[n].env} / {by_name[n].flag})" for n in names)


def _broker_security_problem(values: Mapping[str, Any]) -> str | None:
    """What is inconsistent between the broker security settings, if anything:
    credentials the protocol would silently not use are as wrong as missing ones."""
    protocol = values["broker_security_protocol"]
    sasl, tls = protocol.startswith("SASL_"), protocol.endswith("SSL")
    credentials = ("broker_sasl_username", "broker_sasl_password")
    files = ("broker_ssl_cafile", "broker_ssl_certfile", "broker_ssl_keyfile")
    if sasl and not all(values[n] for n in credentials):
        return f"invalid settings: broker_security_protocol={protocol} needs {_named(*credentials)}"
    if not sasl and any(values[n] for n in credentials):
        return (f"invalid settings: {_named(*credentials)} are used only with SASL_PLAINTEXT or SASL_SSL, "
                f"but broker_security_protocol={protocol}")
    if not tls and any(values[n] for n in files):
        return (f"invalid settings: {_named(*files)} are used only with SSL or SASL_SSL, "
                f"but broker_security_protocol={protocol}")
    if values["broker_ssl_keyfile"] and not values["broker_ssl_certfile"]:
        return f"invalid settings: {_named('broker_ssl_keyfile')} needs {_named('broker_ssl_certfile')}"
    return None


def _replication_problem(values: Mapping[str, Any]) -> str | None:
    """More in-sync replicas than replicas: every acks=all write would fail."""
    if values["min_insync_replicas"] > values["replication_factor"]:
        return (f"invalid settings: {_named('min_insync_replicas')} = {values['min_insync_replicas']} is more "
                f"than {_named('replication_factor')} = {values['replication_factor']}")
    return None


def _tls_problem(values: Mapping[str, Any]) -> str | None:
    """A certificate without its key (or the reverse) serves nothing."""
    cert, key = values["web_tls_cert_file"], values["web_tls_key_file"]
    if bool(cert) != bool(key):
        return f"invalid settings: {_named('web_tls_cert_file')} and {_named('web_tls_key_file')} go together"
    return None


def _rotation_problem(values: Mapping[str, Any]) -> str | None:
    """A previous key without a current one is a rotation half done: refused."""
    for previous, current in (("auth_previous_secret", "auth_secret"),
                              ("auth_previous_public_key_file", "auth_public_key_file")):
        if values[previous] and not values[current]:
            return f"invalid settings: {_named(previous)} needs {_named(current)}"
    return None


@dataclass(frozen=True)
class Settings:
    broker: str
    app_id: str
    partitions: int
    replication_factor: int
    min_insync_replicas: int
    allow_finite_retention: bool
    broker_security_protocol: str
    broker_sasl_mechanism: str
    broker_sasl_username: str | None
    broker_sasl_password: Secret | None
    broker_ssl_cafile: str | None
    broker_ssl_certfile: str | None
    broker_ssl_keyfile: str | None
    processing_guarantee: str
    topic_episodes: str
    topic_requests: str
    topic_reflections: str
    data_dir: str
    seal: str
    scrub: str
    master_keys: str | None
    qdrant_url: str | None
    qdrant_api_key: Secret | None
    view: str
    compact_growth: float
    compact_min_points: int
    embedder: str
    projector_batch: int
    projector_within: float
    session_timeout: float
    rebalance_timeout: float
    fetch_wait: float
    web_host: str
    web_port: int
    advertised_url: str | None
    api_token: Secret | None
    auth_secret: Secret | None
    auth_previous_secret: Secret | None
    auth_public_key_file: str | None
    auth_previous_public_key_file: str | None
    insecure_no_auth: bool
    auth_audience: str | None
    auth_issuer: str | None
    auth_max_ttl: int
    cluster_secret: Secret | None
    web_tls_cert_file: str | None
    web_tls_key_file: str | None
    cluster_ca_file: str | None
    rate_limit: float
    rate_burst: int
    max_request_bytes: int
    log_format: str
    log_level: str
    tracing: str
    reasoner: str
    anthropic_model: str
    prompts: str | None
    prompt_library: str | None
    reasoner_timeout: float
    reasoner_retries: int
    reasoner_batch: str
    anthropic_price: tuple[float, ...] | None
    user_daily_tokens: int
    daily_tokens: int
    tenant_daily_tokens: int
    tenant_delimiter: str
    breaker_failures: int
    breaker_cooldown: float
    refresh: str
    refresh_timeout: float
    recall_min_score: float
    grounding_min_cosine: float | None
    challenge: str
    challenge_min_score: float | None
    challenge_quorum: int
    challenge_daily: int
    stale_after_days: float
    threshold: float
    min_episodes: int
    salience_cut: float
    top_k: int
    max_depth: int
    citation_floor: int
    replay: str | None
    replay_stall: float

    @classmethod
    def load(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> "Settings":
        """Environment first, then non-None overrides (CLI flags); every value checked."""
        env = os.environ if env is None else env
        values = {}
        for spec in SPECS:
            given = overrides.get(spec.name)
            raw = str(given) if given is not None else env.get(spec.env, spec.default)
            try:
                values[spec.name] = spec.parse(raw.strip())
            except ValueError as exc:
                source = spec.flag if given is not None else spec.env
                shown = "'***'" if spec.parse in (_secret, _api_token, _auth_secret) else repr(raw)
                raise SettingsError(
                    f"invalid setting {spec.name} ({source}={shown}): {exc}"
                ) from None
        problem = (_broker_security_problem(values) or _rotation_problem(values) or _replication_problem(values)
                   or _tls_problem(values))
        if problem:
            raise SettingsError(problem)
        if values["recall_min_score"] is None:  # the embedder's own: cosines differ in band per model
            from processors.embedders import RECALL_MIN_SCORE

            values["recall_min_score"] = RECALL_MIN_SCORE[values["embedder"]]
        return cls(**values)

    def child_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """An environment for a child process that resolves to exactly these settings."""
        env = {k: v for k, v in (os.environ if base is None else base).items() if not k.startswith("REFLECT_")}
        for spec in SPECS:
            value = getattr(self, spec.name)
            env[spec.env] = "" if value is None else \
                ",".join(map(str, value)) if isinstance(value, tuple) else str(value)
        return env

    @property
    def bootstrap(self) -> str:
        """host:port list for aiokafka."""
        return self.broker.partition("://")[2]

    @property
    def dlq_episodes(self) -> str:
        """A replay's side worker reads the live `episodes` but dead-letters apart."""
        return f"{self.topic_episodes}{self.replay_suffix}.dlq"

    @property
    def dlq_reflections(self) -> str:
        return f"{self.topic_reflections}.dlq"

    @property
    def topic_revocations(self) -> str:
        """Token ids revoked before they expire (streams/worker/revocations.py): one per deployment."""
        return f"{self.app_id.removesuffix(self.replay_suffix)}.revocations"

    @property
    def topic_keys(self) -> str:
        """The data keys of crypto-shredding (streams/keys.py), compacted: one per log, whatever group
        reads it (another app id, a replay's side worker)."""
        return f"{self.topic_episodes}.keys"

    @property
    def master_keys_path(self) -> Path:
        return Path(self.master_keys) if self.master_keys else Path(self.data_dir) / "master.keys"

    @property
    def replay_suffix(self) -> str:
        """What a replay's side worker adds to the names it owns (streams/worker/replay.py)."""
        return f".replay.{self.replay}" if self.replay else ""

    @property
    def topics(self) -> tuple[str, ...]:
        """Every topic Reflect produces to, created up front with `partitions`."""
        return (
            self.topic_episodes,
            self.topic_requests,
            self.topic_reflections,
            self.dlq_episodes,
            self.dlq_reflections,
            self.topic_revocations,
            self.topic_keys,
        )

    @property
    def canonical_url(self) -> str:
        """Where the other workers reach this one (Faust's canonical_url)."""
        if self.advertised_url:
            return self.advertised_url
        host = socket.gethostname() if self.web_host in ("0.0.0.0", "::", "[::]") else self.web_host
        scheme = "https" if self.web_tls_cert_file else "http"
        return f"{scheme}://{host}:{self.web_port}"

    @property
    def view_dir(self) -> Path:
        return Path(self.data_dir) / "view"


assert [s.name for s in SPECS] == [f.name for f in fields(Settings)]
