from __future__ import annotations

from pathlib import Path

import pytest

from streams.settings import (SPECS, TABLE_BEGIN, TABLE_DOC, TABLE_END, Settings, SettingsError, markdown_table,
                              with_markdown_table)

ROOT = Path(__file__).parents[2]
REGENERATE = f"reflect settings --markdown {TABLE_DOC}"


def test_defaults_are_valid():
    s = Settings.load(env={})
    assert s.broker == "kafka://127.0.0.1:9092" and s.partitions == 4 and s.qdrant_url is None
    assert s.threshold == 15.0 and s.min_episodes == 50 and s.top_k == 8 and s.max_depth == 2


def test_the_configuration_table_is_the_one_the_specs_generate():
    doc = (ROOT / TABLE_DOC).read_text("utf-8")
    assert doc == with_markdown_table(doc, markdown_table()), (
        f"{TABLE_DOC}'s settings table differs from SPECS in streams/settings.py: run `{REGENERATE}` "
        "to regenerate it")


def test_the_table_has_a_row_per_setting_and_replaces_only_what_the_markers_enclose():
    table = markdown_table()
    rows = table.splitlines()[2:]
    assert [r.split(" | ")[0] for r in rows] == [f"| `{s.env}`" for s in SPECS]
    assert "| `REFLECT_QDRANT_URL` | `--qdrant-url` | (empty) |" in table  # an empty default, said so
    assert "| `REFLECT_PARTITIONS` | `--partitions` | `4` |" in table
    doc = f"# title\n\nbefore\n{TABLE_BEGIN}\nstale rows\n{TABLE_END}\nafter\n"
    written = with_markdown_table(doc, table)
    assert written == f"# title\n\nbefore\n{TABLE_BEGIN}\n\n{table}\n{TABLE_END}\nafter\n"
    assert with_markdown_table(written, table) == written  # regenerating an up-to-date doc changes nothing
    for broken in ("no markers", f"{TABLE_END}\n{TABLE_BEGIN}", f"{TABLE_BEGIN}\n{TABLE_BEGIN}\n{TABLE_END}"):
        with pytest.raises(ValueError, match="settings:begin"):
            with_markdown_table(broken, table)


def test_settings_markdown_prints_the_table_or_rewrites_a_doc(tmp_path, monkeypatch, capsys):
    from streams.cli.main import main

    monkeypatch.setenv("REFLECT_PARTITIONS", "zero")  # the table is the code's, whatever the environment says
    assert main(["settings", "--markdown"]) == 0
    assert capsys.readouterr().out == markdown_table()
    doc = tmp_path / "doc.md"
    doc.write_text(f"intro\n{TABLE_BEGIN}\n| old |\n{TABLE_END}\n", "utf-8")
    assert main(["settings", "--markdown", str(doc)]) == 0
    assert doc.read_text("utf-8") == f"intro\n{TABLE_BEGIN}\n\n{markdown_table()}\n{TABLE_END}\n"
    assert "rewritten" in capsys.readouterr().out
    assert main(["settings", "--markdown", str(doc)]) == 0 and "up to date" in capsys.readouterr().out
    doc.write_text("no markers\n", "utf-8")
    assert main(["settings", "--markdown", str(doc)]) == 2
    assert "settings:begin" in capsys.readouterr().err and doc.read_text("utf-8") == "no markers\n"


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


# --- production settings: security, API, logs (issues 9.3–9.5) ---------------

CAFILE = __import__("certifi").where()  # a real CA bundle: the SSL context loads it
SASL = {"REFLECT_BROKER_SECURITY_PROTOCOL": "SASL_SSL", "REFLECT_BROKER_SASL_MECHANISM": "SCRAM-SHA-512",
        "REFLECT_BROKER_SASL_USERNAME": "reflect", "REFLECT_BROKER_SASL_PASSWORD": "s3cret-pw",
        "REFLECT_BROKER_SSL_CAFILE": CAFILE}


def test_production_defaults_are_safe():
    s = Settings.load(env={})
    assert (s.web_host, s.api_token, s.max_request_bytes) == ("127.0.0.1", None, 1024 * 1024)
    assert (s.broker_security_protocol, s.broker_sasl_username, s.broker_sasl_password) == ("PLAINTEXT", None, None)
    assert (s.processing_guarantee, s.log_format, s.log_level, s.tracing) == ("at_least_once", "text", "info", "off")
    assert Settings.load(env={"REFLECT_LOG_LEVEL": "WARNING"}).log_level == "warning"


@pytest.mark.parametrize("env,named", [
    ({"REFLECT_BROKER_SECURITY_PROTOCOL": "TLS"}, "REFLECT_BROKER_SECURITY_PROTOCOL"),
    ({"REFLECT_BROKER_SASL_MECHANISM": "GSSAPI"}, "REFLECT_BROKER_SASL_MECHANISM"),
    ({"REFLECT_BROKER_SECURITY_PROTOCOL": "SSL", "REFLECT_BROKER_SSL_CAFILE": "/no/such/ca.pem"},
     "REFLECT_BROKER_SSL_CAFILE"),
    ({"REFLECT_PROCESSING_GUARANTEE": "exactly-once"}, "REFLECT_PROCESSING_GUARANTEE"),
    ({"REFLECT_LOG_FORMAT": "xml"}, "REFLECT_LOG_FORMAT"),
    ({"REFLECT_LOG_LEVEL": "loud"}, "REFLECT_LOG_LEVEL"),
    ({"REFLECT_TRACING": "yes"}, "REFLECT_TRACING"),
    ({"REFLECT_MAX_REQUEST_BYTES": "0"}, "REFLECT_MAX_REQUEST_BYTES"),
    ({"REFLECT_API_TOKEN": "short"}, "REFLECT_API_TOKEN"),
    ({"REFLECT_API_TOKEN": "has spaces in it, 32 characters"}, "REFLECT_API_TOKEN"),
    ({"REFLECT_WEB_HOST": "every interface"}, "REFLECT_WEB_HOST"),
    ({"REFLECT_AUTH_MAX_TTL": "a week"}, "REFLECT_AUTH_MAX_TTL"),
    ({"REFLECT_RATE_LIMIT": "-1"}, "REFLECT_RATE_LIMIT"),
    ({"REFLECT_TENANT_DELIMITER": "+"}, "REFLECT_TENANT_DELIMITER"),
    ({"REFLECT_CLUSTER_SECRET": "short"}, "REFLECT_CLUSTER_SECRET"),
    ({"REFLECT_WEB_TLS_CERT_FILE": CAFILE}, "REFLECT_WEB_TLS_KEY_FILE"),
])
def test_a_wrong_production_value_fails_naming_the_setting(env, named):
    with pytest.raises(SettingsError, match=named):
        Settings.load(env=env)


@pytest.mark.parametrize("env,named", [
    # SASL without its credentials, or credentials/TLS files the protocol would silently ignore
    ({**SASL, "REFLECT_BROKER_SASL_PASSWORD": ""}, "REFLECT_BROKER_SASL_PASSWORD"),
    ({"REFLECT_BROKER_SECURITY_PROTOCOL": "SASL_PLAINTEXT"}, "REFLECT_BROKER_SASL_USERNAME"),
    ({"REFLECT_BROKER_SASL_USERNAME": "reflect", "REFLECT_BROKER_SASL_PASSWORD": "pw"}, "PLAINTEXT"),
    ({"REFLECT_BROKER_SSL_CAFILE": CAFILE}, "REFLECT_BROKER_SSL_CAFILE"),
    ({"REFLECT_BROKER_SECURITY_PROTOCOL": "SSL", "REFLECT_BROKER_SSL_KEYFILE": CAFILE}, "REFLECT_BROKER_SSL_CERTFILE"),
])
def test_inconsistent_broker_security_fails_naming_the_settings(env, named):
    with pytest.raises(SettingsError, match=named):
        Settings.load(env=env)


def test_secrets_are_masked_wherever_settings_are_shown(monkeypatch, capsys):
    from streams.cli.main import main

    token = "tok-" + "z" * 28
    env = {**SASL, "REFLECT_API_TOKEN": token, "REFLECT_QDRANT_API_KEY": "qdrant-key-1"}
    s = Settings.load(env=env)
    assert str(s.api_token) == token and s.broker_sasl_password == "s3cret-pw"  # usable as strings
    assert all(secret not in repr(s) for secret in ("s3cret-pw", token, "qdrant-key-1"))
    child = s.child_env(base={})
    assert (child["REFLECT_API_TOKEN"], child["REFLECT_BROKER_SASL_PASSWORD"]) == (token, "s3cret-pw")
    assert Settings.load(env=child) == s  # a child process resolves the same settings

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(["settings"]) == 0
    printed = capsys.readouterr().out
    assert "REFLECT_API_TOKEN" in printed and token not in printed and "s3cret-pw" not in printed
    with pytest.raises(SettingsError) as bad:
        Settings.load(env={"REFLECT_API_TOKEN": "not a token but a secret"})
    assert "not a token" not in str(bad.value)  # a mistyped secret is still a secret


def test_one_builder_gives_aiokafka_and_faust_the_same_broker_security():
    import ssl

    import faust
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

    from streams.security import client_options, faust_credentials
    from streams.worker.app import faust_app

    s = Settings.load(env={**SASL, "REFLECT_BROKER": "kafka://b1:9093,b2:9093"})
    options = client_options(s)
    assert options["bootstrap_servers"] == "b1:9093,b2:9093"
    assert {k: options[k] for k in ("security_protocol", "sasl_mechanism", "sasl_plain_username",
                                    "sasl_plain_password")} == {
        "security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "reflect",
        "sasl_plain_password": "s3cret-pw"}
    context = options["ssl_context"]
    assert isinstance(context, ssl.SSLContext) and context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname

    app = faust_app(s)
    credentials = app.conf.broker_credentials
    assert isinstance(credentials, faust.SASLCredentials) and credentials.protocol.value == "SASL_SSL"
    assert (credentials.mechanism.value, credentials.username, credentials.password) == (
        "SCRAM-SHA-512", "reflect", "s3cret-pw")
    # What Faust's driver hands its own aiokafka clients is what ours get.
    faust_side = credentials_to_aiokafka_auth(credentials)
    assert isinstance(faust_side.pop("ssl_context"), ssl.SSLContext)
    assert faust_side == {k: v for k, v in options.items() if k not in ("bootstrap_servers", "ssl_context")}

    async def construct():  # aiokafka checks protocol, mechanism and context when a client is made
        AIOKafkaProducer(**options)
        AIOKafkaConsumer(**options)
    import asyncio
    asyncio.run(construct())

    ssl_only = Settings.load(env={"REFLECT_BROKER_SECURITY_PROTOCOL": "SSL", "REFLECT_BROKER_SSL_CAFILE": CAFILE})
    assert isinstance(faust_credentials(ssl_only), faust.SSLCredentials)
    assert set(client_options(ssl_only)) == {"bootstrap_servers", "security_protocol", "ssl_context"}
    sasl_plain = Settings.load(env={"REFLECT_BROKER_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                                    "REFLECT_BROKER_SASL_USERNAME": "u", "REFLECT_BROKER_SASL_PASSWORD": "p"})
    assert faust_credentials(sasl_plain).protocol.value == "SASL_PLAINTEXT"
    assert "ssl_context" not in client_options(sasl_plain)
    plain = Settings.load(env={})
    assert faust_credentials(plain) is None
    assert client_options(plain) == {"bootstrap_servers": "127.0.0.1:9092", "security_protocol": "PLAINTEXT"}


def test_the_faust_app_takes_guarantee_web_host_and_body_limit_from_settings():
    from streams.worker.app import faust_app

    s = Settings.load(env={"REFLECT_PROCESSING_GUARANTEE": "exactly_once", "REFLECT_WEB_HOST": "0.0.0.0",
                           "REFLECT_MAX_REQUEST_BYTES": "4096", "REFLECT_API_TOKEN": "t" * 32})
    conf = faust_app(s).conf
    assert conf.processing_guarantee.value == "exactly_once"
    assert (conf.web_host, conf.web_bind) == ("0.0.0.0", "0.0.0.0")  # bind: what the server listens on
    assert conf.web_application_options["client_max_size"] == 4096
    assert faust_app(Settings.load(env={})).conf.web_bind == "127.0.0.1"


def test_json_log_lines_carry_context_and_no_quoted_values():
    import json
    import logging

    from schemas import ContractError
    from processors.dlq import redacted
    from streams.worker.logs import JsonFormatter

    record = logging.LogRecord("reflect", logging.WARNING, __file__, 1, "dead-lettered %s@%s", ("episodes", 7), None)
    record.__dict__.update(topic="episodes", offset=7, stage="decode")
    line = json.loads(JsonFormatter().format(record))
    assert line["level"] == "warning" and line["logger"] == "reflect" and line["message"] == "dead-lettered episodes@7"
    assert (line["topic"], line["offset"], line["stage"]) == ("episodes", 7, "decode")
    assert line["time"].endswith("Z")
    error = ContractError("text", "must be shorter than or equal to 16000 characters (got 'my private diary...)")
    assert redacted(error) == "text: must be shorter than or equal to 16000 characters"


def test_the_embedder_choice_and_its_own_recall_floor():
    from processors.embedders import RECALL_MIN_SCORE

    for name in ("hashing", "minilm", "e5-small"):
        s = Settings.load(env={"REFLECT_EMBEDDER": name})
        assert s.embedder == name and s.recall_min_score == RECALL_MIN_SCORE[name]
    assert RECALL_MIN_SCORE["e5-small"] != RECALL_MIN_SCORE["minilm"]  # e5's cosines sit higher
    s = Settings.load(env={"REFLECT_EMBEDDER": "e5-small", "REFLECT_RECALL_MIN_SCORE": "0.5"})
    assert s.recall_min_score == 0.5 and Settings.load(env=s.child_env()).recall_min_score == 0.5
    with pytest.raises(SettingsError, match="REFLECT_EMBEDDER"):
        Settings.load(env={"REFLECT_EMBEDDER": "bge"})


def test_token_lifetimes_and_the_served_scheme():
    assert Settings.load(env={}).auth_max_ttl == 30 * 86400
    assert Settings.load(env={"REFLECT_AUTH_MAX_TTL": "0"}).auth_max_ttl == 0  # no limit
    assert Settings.load(env={"REFLECT_AUTH_MAX_TTL": "15m"}).auth_max_ttl == 900
    tls = Settings.load(env={"REFLECT_WEB_TLS_CERT_FILE": CAFILE, "REFLECT_WEB_TLS_KEY_FILE": CAFILE})
    assert tls.canonical_url.startswith("https://") and Settings.load(env={}).canonical_url.startswith("http://")
