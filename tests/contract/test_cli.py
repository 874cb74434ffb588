import importlib.util
import os
import re
import socket
import subprocess
import sys
import time


def reflect(*args, env=None):
    return subprocess.run([sys.executable, "-m", "streams.cli", *args], capture_output=True, text=True,
                          timeout=60, env=env)


def test_help_lists_the_commands():
    out = reflect("--help")
    assert out.returncode == 0
    for command in ("broker", "topics", "send", "retract", "worker", "settings"):
        assert command in out.stdout


def test_bad_setting_is_a_start_up_error_naming_it():
    out = reflect("send", "--user", "u", "--text", "t", "--importance", "0.5", "--partitions", "-3")
    assert out.returncode == 2 and "--partitions" in out.stderr and "Traceback" not in out.stderr


def test_bad_episode_is_refused_before_anything_is_sent():
    # No broker listens on this port: the contract check must fail first.
    out = reflect("send", "--user", "u", "--text", "t", "--importance", "1.5", "--broker", "127.0.0.1:1")
    assert out.returncode == 2 and "importance" in out.stderr


def test_unreachable_broker_is_a_clear_error():
    out = reflect("topics", "create", "--broker", "127.0.0.1:1")
    assert out.returncode == 1 and "REFLECT_BROKER" in out.stderr and "Traceback" not in out.stderr


def test_each_command_shows_its_own_options_and_settings_lists_every_setting():
    for command in (["send"], ["retract"], ["worker"], ["up"], ["demo"], ["topics", "create"], ["mcp"]):
        out = reflect(*command, "--help")
        assert out.returncode == 0 and "--broker-sasl-password" not in out.stdout, command
        assert len(out.stdout.splitlines()) < 45, (command, len(out.stdout.splitlines()))
    listed = reflect("settings", "--help").stdout
    assert "--broker-sasl-password" in listed and "REFLECT_CITATION_FLOOR" in listed


def test_settings_reports_what_up_and_demo_use():
    env = {k: v for k, v in os.environ.items() if not k.startswith("REFLECT_")}
    out = reflect("settings", "--embedder", "hashing", env=env)
    plain, _, stack = out.stdout.partition("reflect up uses instead")
    assert out.returncode == 0 and re.search(r"REFLECT_WEB_PORT\s+6066", plain)
    assert re.search(r"REFLECT_WEB_PORT\s+8080", stack) and "embedded, on a free port: noida-db" in stack
    assert "REFLECT_EMBEDDER" not in stack  # asked for hashing: up uses it too
    if importlib.util.find_spec("onnxruntime"):
        assert re.search(r"REFLECT_EMBEDDER\s+'minilm'", reflect("settings", env=env).stdout.split("instead")[1])


def test_up_takes_web_port_as_its_port():
    from streams.cli.main import build_parser
    from streams.cli.stack import stack_settings

    for argv, port in ((["up"], 8080), (["up", "--web-port", "9001"], 9001), (["up", "--port", "9002"], 9002)):
        assert stack_settings(build_parser().parse_args(argv), env={})[0].web_port == port


def test_a_port_in_use_is_one_line_before_anything_is_created(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        up = reflect("up", "--port", str(port), "--data-dir", str(tmp_path / "d"))
        worker = reflect("worker", "--web-port", str(port), "--data-dir", str(tmp_path / "w"),
                         "--broker", "127.0.0.1:1")
    assert up.returncode == 2 and up.stderr.count("\n") == 1 and "--port" in up.stderr
    assert f"127.0.0.1:{port}" in up.stderr and "in use" in up.stderr
    assert worker.returncode == 2 and worker.stderr.count("\n") == 1 and "REFLECT_WEB_PORT" in worker.stderr
    assert not (tmp_path / "d").exists() and not (tmp_path / "w").exists()  # no view, no broker, no topics
    assert time.monotonic() - started < 30


def test_send_metadata_must_be_a_json_object():
    for bad in ("[1]", "{oops"):
        out = reflect("send", "--user", "u", "--text", "t", "--importance", "0.5", "--metadata", bad)
        assert out.returncode == 2 and "--metadata" in out.stderr and "Traceback" not in out.stderr
