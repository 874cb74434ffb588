"""deploy/ checked offline: the image, compose, Prometheus, Kubernetes, and the
testcontainers selections of tests/conftest.py. No network, no Docker engine;
the checks that need a tool (docker compose, kubectl) skip without it.

A misspelt REFLECT_* variable is silently ignored by a worker, and a probe on
the wrong port restarts healthy pods: these tests make such slips fail CI.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import tomllib
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from streams.broker import free_port
from streams.settings import SPECS, Settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
SETTING_NAMES = {spec.env for spec in SPECS}
HEALTHZ = "/healthz"


def load_yaml(path: Path):
    return yaml.safe_load(path.read_text())


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def interpolate(value) -> str:
    """Compose's ${VAR:-default} / ${VAR-default} / ${VAR}, with nothing set in
    the environment: what a plain `docker compose up` gives a container."""
    def one(match: re.Match) -> str:
        return (match.group(3) or "") if match.group(2) in (":-", "-") else ""

    return re.sub(r"\$\{(\w+)(?:(:?[-?])([^}]*))?\}", one, str(value)).replace("$$", "$")


# --- every REFLECT_* name is a setting ---------------------------------------

def test_every_reflect_variable_in_deploy_is_a_setting():
    used: dict[str, set[str]] = {}
    for path in sorted(p for p in DEPLOY.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        for name in re.findall(r"\bREFLECT_[A-Z0-9_]+", path.read_text(errors="replace")):
            if not name.startswith("REFLECT_TEST_"):  # test selectors, not worker settings
                used.setdefault(name, set()).add(str(path.relative_to(DEPLOY)))
    assert "REFLECT_BROKER" in used and "REFLECT_QDRANT_URL" in used  # the scan sees the files
    unknown = {name: sorted(files) for name, files in used.items() if name not in SETTING_NAMES}
    assert not unknown, f"not settings in streams/settings.py (a worker would ignore them): {unknown}"


# --- compose ------------------------------------------------------------------

def compose() -> dict:
    return load_yaml(DEPLOY / "compose.yaml")


def service_env(service: dict) -> dict[str, str]:
    return {k: interpolate(v) for k, v in (service.get("environment") or {}).items()}


def test_compose_runs_kafka_in_kraft_qdrant_topics_workers_and_prometheus():
    services = compose()["services"]
    assert {"kafka", "qdrant", "topics", "worker", "prometheus"} <= set(services)
    images = {name: services[name]["image"] for name in ("kafka", "qdrant", "prometheus", "worker", "topics")}
    assert images["kafka"].startswith("apache/kafka:")
    assert images["qdrant"].startswith("qdrant/qdrant:")
    assert images["prometheus"].startswith("prom/prometheus:")
    for name, image in images.items():  # pinned: a new release must be a decision
        assert ":" in image and not image.endswith(":latest"), (name, image)
    kafka = service_env(services["kafka"])
    assert "controller" in kafka["KAFKA_PROCESS_ROLES"] and not any("ZOOKEEPER" in k for k in kafka)
    for name in ("worker", "topics"):  # built from this repository
        build = services[name]["build"]
        assert (DEPLOY / build["context"]).resolve() == ROOT
        assert (ROOT / build["dockerfile"]).resolve() == DEPLOY / "Dockerfile"
    assert services["topics"]["command"] == ["topics", "create"]
    assert services["worker"]["command"] == ["worker"]


def test_compose_worker_settings_load_and_point_at_the_services():
    services = compose()["services"]
    env = service_env(services["worker"])
    settings = Settings.load(env=env)  # every value valid, or the worker would not start
    kafka = service_env(services["kafka"])
    host, port = settings.bootstrap.split(":")
    assert f"//{host}:{port}" in kafka["KAFKA_ADVERTISED_LISTENERS"] and host == "kafka"
    # Several workers share one view: a Qdrant server, never per-container Edge.
    view = urlsplit(settings.qdrant_url)
    assert view.hostname == "qdrant" and view.port == 6333
    assert settings.partitions >= int(interpolate(services["worker"]["deploy"]["replicas"]))
    # The topic job must create what the workers consume.
    topics = Settings.load(env=service_env(services["topics"]))
    for name in ("broker", "app_id", "partitions", "replication_factor", "topic_episodes",
                 "topic_requests", "topic_reflections"):
        assert getattr(topics, name) == getattr(settings, name), name
    assert not any(k.startswith("ANTHROPIC") and v for k, v in env.items()), "a key is hard-coded"
    assert services["worker"]["environment"]["ANTHROPIC_API_KEY"].startswith("${ANTHROPIC_API_KEY")


def test_compose_workers_scale_and_wait_for_what_they_need():
    services = compose()["services"]
    worker = services["worker"]
    assert int(interpolate(worker["deploy"]["replicas"])) >= 1
    assert "container_name" not in worker  # one name cannot be N containers
    web_port = Settings.load(env=service_env(worker)).web_port
    for published in worker.get("ports", []):  # a fixed host port cannot be N containers either
        assert ":" not in str(published) and int(published) == web_port, published
    assert worker["depends_on"]["topics"]["condition"] == "service_completed_successfully"
    assert worker["depends_on"]["qdrant"]["condition"] == "service_healthy"
    assert services["topics"]["depends_on"]["kafka"]["condition"] == "service_healthy"
    for name in ("kafka", "qdrant", "worker"):
        assert services[name]["healthcheck"]["test"], name
    assert worker["healthcheck"]["test"][-1] == healthcheck_path_in_image()
    for dependency in (d for s in services.values() for d in s.get("depends_on", [])):
        assert dependency in services, dependency


def test_prometheus_scrapes_every_worker_metrics_on_the_web_port():
    services = compose()["services"]
    web_port = Settings.load(env=service_env(services["worker"])).web_port
    mounts = dict(v.split(":")[:2] for v in services["prometheus"]["volumes"])
    assert mounts["./prometheus.yml"] == "/etc/prometheus/prometheus.yml"
    config = load_yaml(DEPLOY / "prometheus.yml")
    jobs = [j for j in config["scrape_configs"] if j.get("metrics_path") == "/metrics"]
    assert jobs, "no job scrapes /metrics"
    discovered = [(name, sd["port"]) for j in jobs for sd in j.get("dns_sd_configs", []) for name in sd["names"]]
    assert ("worker", web_port) in discovered, discovered


@pytest.mark.skipif(shutil.which("docker") is None, reason="no docker CLI on this machine")
def test_docker_compose_accepts_the_file():
    version = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True)
    if version.returncode != 0:
        pytest.skip(f"the docker CLI has no compose plugin: {(version.stderr or version.stdout).strip()}")
    # `config` parses, interpolates and checks the file against the compose spec; no engine needed.
    checked = subprocess.run(["docker", "compose", "-f", str(DEPLOY / "compose.yaml"), "config", "--quiet"],
                             capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stderr


# --- the image ----------------------------------------------------------------

def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments), continuation lines joined, comments dropped."""
    out, pending = [], ""
    for raw in (DEPLOY / "Dockerfile").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        word, _, args = (pending + line).partition(" ")
        out.append((word.upper(), args.strip()))
        pending = ""
    return out


def instructions(name: str) -> list[str]:
    return [args for word, args in dockerfile() if word == name]


def copies() -> list[tuple[list[str], str]]:
    found = []
    for args in instructions("COPY"):
        words = [w for w in shlex.split(args) if not w.startswith("--")]
        found.append((words[:-1], words[-1]))
    return found


def healthcheck_path_in_image() -> str:
    return next(dest for sources, dest in copies() if sources == ["deploy/healthcheck.py"])


def test_dockerfile_base_user_entrypoint_port_and_healthcheck():
    assert instructions("FROM") == ["python:3.12-slim"]
    user = instructions("USER")[-1].split(":")[0]
    assert user not in ("root", "0")
    assert json.loads(instructions("ENTRYPOINT")[-1]) == ["reflect"]
    assert json.loads(instructions("CMD")[-1]) == ["worker"]
    env = dict(w.split("=", 1) for args in instructions("ENV") for w in shlex.split(args))
    assert instructions("EXPOSE") == [env["REFLECT_WEB_PORT"]]
    assert env["REFLECT_WEB_HOST"] == "0.0.0.0"  # probes and Prometheus come from outside the container
    health = instructions("HEALTHCHECK")[-1]
    assert json.loads(health.split(" CMD ", 1)[1]) == ["python", healthcheck_path_in_image()]


def test_dockerfile_copies_what_the_package_build_needs_and_dockerignore_keeps_it():
    project = pyproject()
    packages = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    needed = {"pyproject.toml", project["project"]["readme"], *packages}
    copied = {src.rstrip("/") for sources, _ in copies() for src in sources}
    assert needed <= copied, f"not copied into the image: {needed - copied}"
    patterns = [p.strip() for p in (ROOT / ".dockerignore").read_text().splitlines()
                if p.strip() and not p.startswith("#")]

    def ignored(path: str) -> bool:
        parts = Path(path).parts
        return any(fnmatch.fnmatch("/".join(parts[:i]), p) for i in range(1, len(parts) + 1) for p in patterns)

    assert not [src for src in copied if ignored(src)]
    assert ignored(".git") and ignored("tests/conftest.py")  # the patterns do match something


def test_the_entry_command_is_the_reflect_console_script_and_runs():
    target = pyproject()["project"]["scripts"]["reflect"]
    assert target == "streams.cli.main:main"
    module, func = target.split(":")
    # What the installed script does, through the declared target itself.
    code = f"import sys, {module} as m; sys.exit(m.{func}(sys.argv[1:]))"
    run = subprocess.run([sys.executable, "-c", code, "worker", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "reflect settings --help" in run.stdout.replace("\n", " "), run.stderr
    # The worker's settings (each a flag of every command) are listed by `settings --help`.
    run = subprocess.run([sys.executable, "-c", code, "settings", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert "--broker" in run.stdout and "--qdrant-url" in run.stdout and "--web-port" in run.stdout


class _Status(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(self.server.status if self.path == HEALTHZ else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("status, code", [(200, 0), (503, 1), (None, 1)])
def test_the_image_healthcheck_passes_only_on_healthz_200(status, code):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Status) if status else None
    port = server.server_address[1] if server else free_port()  # None: nothing listens
    if server:
        server.status = status
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = {**os.environ, "REFLECT_WEB_HOST": "0.0.0.0", "REFLECT_WEB_PORT": str(port)}
        run = subprocess.run([sys.executable, str(DEPLOY / "healthcheck.py")], env=env,
                             capture_output=True, text=True, timeout=30)
    finally:
        if server:
            server.shutdown()
            server.server_close()
    assert run.returncode == code, run.stdout + run.stderr


# --- Kubernetes ---------------------------------------------------------------

def manifests() -> list[dict]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def one(kind: str) -> dict:
    found = [d for d in manifests() if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def pod_spec(kind: str) -> dict:
    return one(kind)["spec"]["template"]["spec"]


def container(kind: str) -> dict:
    return pod_spec(kind)["containers"][0]


def selects(selector: dict, labels: dict) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def k8s_settings() -> Settings:
    """What a worker pod resolves: the ConfigMap plus the Secret's REFLECT_* values."""
    secret = one("Secret").get("stringData", {})
    secrets = {k: v for k, v in secret.items() if k.startswith("REFLECT_")}
    return Settings.load(env={**one("ConfigMap")["data"], **secrets})


def test_kustomization_lists_every_manifest():
    listed = set(load_yaml(K8S / "kustomization.yaml")["resources"])
    assert listed == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}


def test_every_manifest_has_api_version_kind_and_name():
    docs = manifests()
    assert {"ConfigMap", "Secret", "Deployment", "Service", "PodDisruptionBudget", "Job"} <= {d["kind"] for d in docs}
    for doc in docs:
        assert doc.get("apiVersion") and doc.get("kind") and doc.get("metadata", {}).get("name"), doc


def test_manifests_match_the_kubernetes_schemas():
    kubernetes_validate = pytest.importorskip("kubernetes_validate")  # bundles the schemas: offline
    for doc in manifests():
        # strict: an unknown (misspelt) field is an error, not silently dropped
        kubernetes_validate.validate(doc, "1.30", strict=True)


def test_worker_deployment_probes_resources_and_settings():
    deployment = one("Deployment")
    spec = deployment["spec"]
    assert isinstance(spec["replicas"], int) and spec["replicas"] >= 1
    assert selects(spec["selector"]["matchLabels"], spec["template"]["metadata"]["labels"])
    worker = container("Deployment")
    ports = {p["name"]: p["containerPort"] for p in worker["ports"]}
    settings = k8s_settings()
    assert settings.web_port in ports.values()
    probes = {k: worker[k] for k in ("startupProbe", "readinessProbe", "livenessProbe") if k in worker}
    assert {"readinessProbe", "livenessProbe"} <= set(probes)
    for name, probe in probes.items():
        get = probe["httpGet"]
        # Liveness must not fail while the worker waits on the view (degraded).
        assert get["path"] == ("/livez" if name == "livenessProbe" else HEALTHZ), name
        assert ports.get(get["port"], get["port"]) == settings.web_port, name
    assert {"cpu", "memory"} <= set(worker["resources"]["requests"])
    assert "memory" in worker["resources"]["limits"]
    assert pod_spec("Deployment")["securityContext"]["runAsNonRoot"] is True
    assert settings.qdrant_url, "replicas share one view: a Qdrant server, not Edge"
    assert worker["envFrom"] == [{"configMapRef": {"name": one("ConfigMap")["metadata"]["name"]}}]
    # the data dir is writable (the root filesystem is not)
    assert settings.data_dir in {m["mountPath"] for m in worker["volumeMounts"]}


def test_each_pod_advertises_where_the_others_forward_its_users_reads():
    env = {e["name"]: e for e in container("Deployment")["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    url = env["REFLECT_ADVERTISED_URL"]["value"]
    assert url == f"http://$(POD_IP):{k8s_settings().web_port}"
    names = list(env)  # Kubernetes expands $(POD_IP) only from a variable defined before it
    assert names.index("POD_IP") < names.index("REFLECT_ADVERTISED_URL")


def test_the_anthropic_key_comes_from_the_secret():
    env = {e["name"]: e for e in container("Deployment")["env"]}
    ref = env["ANTHROPIC_API_KEY"]["valueFrom"]["secretKeyRef"]
    secret = one("Secret")
    assert ref["name"] == secret["metadata"]["name"]
    assert ref["key"] in {**secret.get("data", {}), **secret.get("stringData", {})}
    assert not env["ANTHROPIC_API_KEY"].get("value")
    for name, entry in env.items():  # secret values only from the Secret (names: the scan above)
        if name not in ("POD_IP", "REFLECT_ADVERTISED_URL"):  # where the pod is reached: not a secret
            assert "secretKeyRef" in entry.get("valueFrom", {}), name


def test_pdb_and_service_select_the_worker_pods_only():
    pod_labels = one("Deployment")["spec"]["template"]["metadata"]["labels"]
    job_labels = one("Job")["spec"]["template"]["metadata"]["labels"]
    pdb, service = one("PodDisruptionBudget"), one("Service")
    assert selects(pdb["spec"]["selector"]["matchLabels"], pod_labels)
    assert selects(service["spec"]["selector"], pod_labels)
    assert not selects(service["spec"]["selector"], job_labels)  # no traffic to the topic job
    ports = {p["name"]: p["containerPort"] for p in container("Deployment")["ports"]}
    target = service["spec"]["ports"][0]["targetPort"]
    assert ports.get(target, target) == k8s_settings().web_port
    notes = service["metadata"]["annotations"]
    assert notes["prometheus.io/scrape"] == "true" and notes["prometheus.io/path"] == "/metrics"
    assert int(notes["prometheus.io/port"]) == k8s_settings().web_port


def test_topics_job_runs_reflect_topics_create_with_the_worker_settings():
    job, worker = container("Job"), container("Deployment")
    assert job["args"] == ["topics", "create"]
    assert job["image"] == worker["image"] and job["envFrom"] == worker["envFrom"]
    assert pod_spec("Job")["restartPolicy"] in ("OnFailure", "Never")


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="no kubectl on this machine")
def test_kubectl_kustomize_renders_every_manifest():
    rendered = subprocess.run(["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, timeout=60)
    assert rendered.returncode == 0, rendered.stderr
    kinds = sorted(d["kind"] for d in yaml.safe_load_all(rendered.stdout) if d)
    assert kinds == sorted(d["kind"] for d in manifests())


# --- testcontainers selections ------------------------------------------------

@pytest.mark.parametrize("variable, value", [("REFLECT_TEST_BROKER", "kafka"), ("REFLECT_TEST_QDRANT", "server")])
def test_a_container_selection_without_docker_skips_with_the_reason(tmp_path, variable, value):
    # A test that needs the session's broker and view, with tests/conftest.py as
    # its plugin; DOCKER_HOST points at no engine, whatever this machine has.
    probe = tmp_path / "test_probe.py"
    probe.write_text("def test_needs_broker_and_view(settings):\n    assert settings.broker\n")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("REFLECT_TEST_", "TESTCONTAINERS_", "TC_", "DOCKER_"))}
    env.update({variable: value, "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock",
                "HOME": str(tmp_path)})  # no ~/.testcontainers.properties overriding DOCKER_HOST
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "tests"), env.get("PYTHONPATH")]))  # support
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider",
                          "-q", "-rs", str(probe)], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=180)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out  # skipped, not failed, errored, or 5 (nothing collected)
    assert "1 skipped" in out and "passed" not in out, out
    assert f"{variable}={value} needs a Docker engine" in out, out


# --- auth on, as shipped (issue 22, fail closed) ----------------------------------

def test_compose_and_manifests_ship_with_auth_on():
    from streams.auth import exposure_problem

    worker = compose()["services"]["worker"]
    # Compose refuses to start without the secret (${VAR:?message}), rather than start exposed.
    assert re.fullmatch(r"\$\{REFLECT_AUTH_SECRET:\?[^}]+\}", worker["environment"]["REFLECT_AUTH_SECRET"])
    given = {**service_env(worker), "REFLECT_AUTH_SECRET": "k" * 64}
    assert exposure_problem(Settings.load(env=given)) is None
    assert exposure_problem(Settings.load(env=service_env(worker))) is not None  # unset: the worker would refuse
    assert "REFLECT_INSECURE_NO_AUTH" not in worker["environment"]
    # Prometheus scrapes /metrics (admin) with a token file compose mounts as a secret.
    job = load_yaml(DEPLOY / "prometheus.yml")["scrape_configs"][0]
    token_file = job["authorization"]["credentials_file"]
    services = compose()["services"]
    [secret] = services["prometheus"]["secrets"]
    assert token_file == f"/run/secrets/{secret}" and secret in compose()["secrets"]

    env = {e["name"]: e for e in container("Deployment")["env"]}
    ref = env["REFLECT_AUTH_SECRET"]["valueFrom"]["secretKeyRef"]
    assert ref["name"] == one("Secret")["metadata"]["name"] and not ref.get("optional")
    assert "REFLECT_AUTH_SECRET" in one("Secret")["stringData"]
    assert "REFLECT_INSECURE_NO_AUTH" not in one("ConfigMap")["data"]
    pod = k8s_settings()
    assert pod.web_host == "0.0.0.0" and exposure_problem(pod) is not None  # the empty placeholder: refused
    assert exposure_problem(replace(pod, auth_secret="k" * 64)) is None


def test_daily_token_budgets_are_finite_by_default():
    s = Settings.load(env={})
    assert 0 < s.user_daily_tokens <= s.daily_tokens
