import subprocess
import sys


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
