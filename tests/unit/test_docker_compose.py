"""docker/docker-compose.yml, docker/Dockerfile and their files, checked without a Docker engine.

The compose file is parsed with PyYAML and its `${VAR:-default}` substitution is done here the way Compose
does it, once with no settings at all (the defaults) and once with docker/.env.example, so the connection
strings are checked as the containers will see them. The one test that needs Docker (`docker compose
config`) is skipped when the compose plugin is missing.
"""
from __future__ import annotations

import configparser
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest

from tests.unit.docker_files import interpolate_tree, python_constant, read_env_file, variables_in

yaml = pytest.importorskip("yaml", reason="PyYAML is needed to read docker/docker-compose.yml")

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
COMPOSE_FILE = DOCKER / "docker-compose.yml"
DOCKERFILE = DOCKER / "Dockerfile"
DOCKERIGNORE = DOCKER / "Dockerfile.dockerignore"
ENV_EXAMPLE = DOCKER / ".env.example"

AIRFLOW_SERVICES = ("airflow-init", "airflow-api-server", "airflow-scheduler", "airflow-dag-processor",
                    "airflow-triggerer")
LONG_RUNNING_AIRFLOW = AIRFLOW_SERVICES[1:]
SPARK_SERVICES = ("spark-master", "spark-worker")
ONE_SHOT = ("minio-init", "airflow-init")
REQUIRED_SERVICES = ("postgres", "minio", "minio-init", *SPARK_SERVICES, *AIRFLOW_SERVICES)
# what tiering/config.py and the DAGs need in every Airflow container (the CLI reads the TIERING_* ones)
REQUIRED_AIRFLOW_ENV = ("TIERING_TIER1_ROOT", "AIRFLOW_CONN_TIERING_METADATA", "AIRFLOW_CONN_TIERING_S3",
                        "AIRFLOW_CONN_SPARK_DEFAULT", "TIERING_DATABASE_URL", "TIERING_BUCKET", "AIRFLOW_CONFIG",
                        "TIERING_REPO", "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "AIRFLOW__API_AUTH__JWT_SECRET")

# Keys this compose file may use in a service: a misspelt key is ignored by nobody but is easy to miss here.
SERVICE_KEYS = {"image", "build", "command", "entrypoint", "environment", "env_file", "volumes", "ports",
                "depends_on", "healthcheck", "restart", "hostname", "user", "working_dir", "networks",
                "profiles", "deploy", "expose", "extra_hosts", "labels", "container_name", "init",
                "stop_grace_period", "ulimits", "shm_size", "pull_policy"}
HEALTHCHECK_KEYS = {"test", "interval", "timeout", "retries", "start_period", "start_interval", "disable"}
DEPENDS_ON_CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}


# -- fixtures -------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def raw() -> dict:
    assert COMPOSE_FILE.is_file(), f"{COMPOSE_FILE} is missing"
    data = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(data, dict) and isinstance(data.get("services"), dict)
    return data


@pytest.fixture(scope="module")
def env_example() -> dict[str, str]:
    assert ENV_EXAMPLE.is_file(), f"{ENV_EXAMPLE} is missing"
    return read_env_file(ENV_EXAMPLE)


ENV_SETS = ["defaults", "env-example"]


@pytest.fixture(scope="module", params=ENV_SETS)
def compose(request, raw, env_example) -> dict:
    """The compose file as the containers see it: substituted with no settings, or with .env.example."""
    env = {} if request.param == "defaults" else env_example
    return interpolate_tree(raw, env)


def services(data: dict) -> dict[str, dict]:
    return data["services"]


def environment(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def mounts(service: dict) -> list[tuple[str, str, str]]:
    """(type, source, target) of each volume entry, short or long syntax."""
    out = []
    for vol in service.get("volumes") or []:
        if isinstance(vol, dict):
            out.append((vol.get("type", "volume"), str(vol.get("source", "")), vol["target"]))
            continue
        parts = vol.split(":")
        source, target = (parts[0], parts[1]) if len(parts) > 1 else ("", parts[0])
        kind = "bind" if source.startswith((".", "/", "~")) else "volume"
        out.append((kind, source, target))
    return out


def bind_targets(service: dict) -> dict[str, Path]:
    """container path -> host path, for bind mounts."""
    return {target: (DOCKER / source).resolve() for kind, source, target in mounts(service) if kind == "bind"}


def depends_on(service: dict) -> dict[str, str]:
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        return {name: "service_started" for name in deps}
    return {name: (spec or {}).get("condition", "service_started") for name, spec in deps.items()}


def published_ports(service: dict) -> list[tuple[str, int, int]]:
    """(host address, host port, container port) of each published port."""
    out = []
    for port in service.get("ports") or []:
        if isinstance(port, dict):
            out.append((port.get("host_ip", ""), int(port["published"]), int(port["target"])))
            continue
        parts = str(port).split(":")
        if len(parts) == 3:
            out.append((parts[0], int(parts[1]), int(parts[2].split("/")[0])))
        elif len(parts) == 2:
            out.append(("", int(parts[0]), int(parts[1].split("/")[0])))
    return out


def command_text(service: dict) -> str:
    cmd = service.get("command") or ""
    return " ".join(cmd) if isinstance(cmd, list) else str(cmd)


# -- services, images, mounts ---------------------------------------------------------------------------

def test_required_services_exist(raw):
    missing = [s for s in REQUIRED_SERVICES if s not in services(raw)]
    assert not missing, f"services missing from docker-compose.yml: {missing}"


def test_service_keys_are_known(raw):
    for name, svc in services(raw).items():
        unknown = set(svc) - SERVICE_KEYS
        assert not unknown, f"{name}: unknown keys {sorted(unknown)} (typo?)"
        if "healthcheck" in svc:
            assert set(svc["healthcheck"]) <= HEALTHCHECK_KEYS, f"{name}: healthcheck keys {svc['healthcheck']}"
    assert set(raw) - {"name", "services", "volumes", "networks", "configs", "secrets"} <= {
        k for k in raw if k.startswith("x-")}, f"unknown top-level keys: {sorted(raw)}"


@pytest.mark.parametrize("name", AIRFLOW_SERVICES + SPARK_SERVICES)
def test_airflow_and_spark_services_use_the_built_image(compose, name):
    svc = services(compose)[name]
    build = svc.get("build")
    assert isinstance(build, dict), f"{name}: no build section"
    context = (DOCKER / build["context"]).resolve()
    assert context == REPO, f"{name}: build context {context} is not the repository root"
    assert (context / build["dockerfile"]).resolve() == DOCKERFILE, f"{name}: builds {build['dockerfile']}"
    images = {services(compose)[s].get("image") for s in AIRFLOW_SERVICES + SPARK_SERVICES}
    assert len(images) == 1 and None not in images, f"one image tag for every built service, got {images}"


@pytest.mark.parametrize("name", AIRFLOW_SERVICES)
def test_airflow_services_mount_dags_plugins_and_cfg(compose, name):
    svc = services(compose)[name]
    env = environment(svc)
    binds = bind_targets(svc)
    by_host = {host: target for target, host in binds.items()}
    for host in ("dags", "plugins", "airflow.cfg"):
        assert REPO / host in by_host, f"{name}: ../{host} is not mounted"
    assert by_host[REPO / "airflow.cfg"] == env["AIRFLOW_CONFIG"], f"{name}: AIRFLOW_CONFIG is not the mounted cfg"

    # airflow.cfg's folders, expanded with the container's environment, are the mounted directories
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(REPO / "airflow.cfg")
    for key, host in (("dags_folder", "dags"), ("plugins_folder", "plugins")):
        value = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: env.get(m.group(1) or m.group(2), m.group(0)),
                       cfg["core"][key])
        assert "$" not in value, f"{name}: [core] {key} = {cfg['core'][key]} does not expand: {value}"
        assert PurePosixPath(value) == PurePosixPath(by_host[REPO / host]), f"{name}: {key} -> {value}"
    for target, _host in binds.items():
        mode = next(v for v in svc["volumes"] if isinstance(v, str) and v.split(":")[1] == target)
        assert mode.endswith(":ro"), f"{name}: the repository mount {mode} should be read-only"


def test_every_host_path_exists(compose):
    for name, svc in services(compose).items():
        for target, host in bind_targets(svc).items():
            assert host.exists(), f"{name}: bind mount source {host} (-> {target}) does not exist"
        if "build" in svc:
            context = (DOCKER / svc["build"]["context"]).resolve()
            assert context.is_dir(), f"{name}: build context {context} does not exist"
            assert (context / svc["build"]["dockerfile"]).is_file(), f"{name}: no {svc['build']['dockerfile']}"


def test_named_volumes_are_declared(compose):
    declared = set(compose.get("volumes") or {})
    for name, svc in services(compose).items():
        for kind, source, target in mounts(svc):
            if kind == "volume" and source:
                assert source in declared, f"{name}: volume {source} (-> {target}) is not declared"


def test_tier1_volume_is_shared_at_the_same_path(compose):
    roots = {environment(services(compose)[n])["TIERING_TIER1_ROOT"] for n in AIRFLOW_SERVICES}
    assert len(roots) == 1, f"TIERING_TIER1_ROOT differs between Airflow services: {roots}"
    root = roots.pop()
    sources = set()
    for name in AIRFLOW_SERVICES + ("spark-worker",):
        at_root = [(kind, source) for kind, source, target in mounts(services(compose)[name]) if target == root]
        assert at_root, f"{name}: nothing mounted at TIERING_TIER1_ROOT={root}"
        assert at_root[0][0] == "volume", f"{name}: tier 1 should be a named volume shared by the containers"
        sources.add(at_root[0][1])
    assert len(sources) == 1, f"tier-1 mounts are not one volume: {sources}"


# -- environment and connections ------------------------------------------------------------------------

@pytest.mark.parametrize("name", AIRFLOW_SERVICES)
def test_airflow_services_get_the_required_environment(compose, name):
    env = environment(services(compose)[name])
    missing = [k for k in REQUIRED_AIRFLOW_ENV if not env.get(k)]
    assert not missing, f"{name}: environment lacks {missing}"
    assert env["TIERING_TIER1_ROOT"].startswith("/")
    assert env.get("AIRFLOW__CORE__EXECUTOR", "LocalExecutor") == "LocalExecutor"


def test_airflow_components_share_their_secrets(compose):
    """The JWT secret must match across api-server, scheduler, dag-processor and triggerer, and so must
    the database and the fernet key."""
    for key in ("AIRFLOW__API_AUTH__JWT_SECRET", "AIRFLOW__API__SECRET_KEY", "AIRFLOW__CORE__FERNET_KEY",
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "AIRFLOW__CORE__EXECUTION_API_SERVER_URL"):
        values = {environment(services(compose)[n]).get(key) for n in AIRFLOW_SERVICES}
        assert len(values) == 1, f"{key} differs between the Airflow services"


def test_airflow_database_is_its_own_database_on_postgres(compose):
    env = environment(services(compose)["airflow-scheduler"])
    url = env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    m = re.fullmatch(r"postgresql(\+psycopg2)?://([^:@/]+):([^@/]*)@([^:/]+):(\d+)/(\w+)", url)
    assert m, "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN is not a postgresql URL"
    _, user, password, host, _port, database = m.groups()
    pg = environment(services(compose)["postgres"])
    assert host == "postgres" and user == pg["POSTGRES_USER"] and password == pg["POSTGRES_PASSWORD"]
    assert database != pg["POSTGRES_DB"], "Airflow's metadata must not share the tiering database"
    init = [host_path for target, host_path in bind_targets(services(compose)["postgres"]).items()
            if target == "/docker-entrypoint-initdb.d"]
    assert init, "postgres: no init scripts mounted at /docker-entrypoint-initdb.d"
    scripts = " ".join(p.read_text() for p in sorted(init[0].glob("*.sql")))
    assert re.search(rf"CREATE\s+DATABASE\s+\"?{database}\"?", scripts, re.I), f"no init script creates {database}"
    api = services(compose)["airflow-api-server"]
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"].startswith("http://airflow-api-server:8080/")
    assert any(target == 8080 for _, _, target in published_ports(api))


def connections(env: dict[str, str]) -> dict[str, dict]:
    out = {}
    for var in ("AIRFLOW_CONN_TIERING_METADATA", "AIRFLOW_CONN_TIERING_S3", "AIRFLOW_CONN_SPARK_DEFAULT"):
        try:
            out[var] = json.loads(env[var])
        except json.JSONDecodeError as exc:
            pytest.fail(f"{var} is not valid JSON after substitution: {exc}")
    return out


@pytest.mark.parametrize("name", AIRFLOW_SERVICES)
def test_connections_parse_and_point_at_the_services(compose, name):
    env = environment(services(compose)[name])
    conns = connections(env)
    pg, s3, spark = (conns[k] for k in ("AIRFLOW_CONN_TIERING_METADATA", "AIRFLOW_CONN_TIERING_S3",
                                        "AIRFLOW_CONN_SPARK_DEFAULT"))
    assert pg["conn_type"] == "postgres" and s3["conn_type"] == "aws" and spark["conn_type"] == "spark"

    pg_env = environment(services(compose)["postgres"])
    assert (pg["host"], int(pg["port"])) == ("postgres", 5432)
    assert pg["login"] == pg_env["POSTGRES_USER"] and pg["password"] == pg_env["POSTGRES_PASSWORD"]
    assert pg["schema"] == pg_env["POSTGRES_DB"], "tiering_metadata must use the database POSTGRES_DB creates"

    extra = s3["extra"]
    assert {"endpoint_url", "bucket", "prefix", "region_name"} <= set(extra)
    assert extra["endpoint_url"] == "http://minio:9000"
    minio_env = environment(services(compose)["minio"])
    assert (s3["login"], s3["password"]) == (minio_env["MINIO_ROOT_USER"], minio_env["MINIO_ROOT_PASSWORD"])
    assert extra["bucket"] == environment(services(compose)["minio-init"])["BUCKET"], "minio-init makes another bucket"
    assert len(extra["bucket"]) >= 3 and extra["prefix"].endswith("/")
    # the `tiering` command's settings say the same as the connections
    assert env["TIERING_BUCKET"] == extra["bucket"] and env["TIERING_PREFIX"] == extra["prefix"]
    assert env["TIERING_S3_ENDPOINT_URL"] == extra["endpoint_url"]
    assert env["AWS_DEFAULT_REGION"] == extra["region_name"]
    assert (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]) == (s3["login"], s3["password"])
    assert env["TIERING_DATABASE_URL"] == (f"postgresql://{pg['login']}:{pg['password']}@{pg['host']}:"
                                           f"{pg['port']}/{pg['schema']}")

    assert (spark["host"], int(spark["port"])) == ("spark://spark-master", 7077)
    assert "--port 7077" in command_text(services(compose)["spark-master"])
    assert "spark://spark-master:7077" in command_text(services(compose)["spark-worker"])


def test_aws_s3_instead_of_minio(raw, env_example):
    """An empty TIER2_ENDPOINT_URL means AWS S3: no endpoint in the connection nor in the CLI settings."""
    env = {**env_example, "TIER2_ENDPOINT_URL": "", "TIER2_BUCKET": "my-company-tiering",
           "TIER2_REGION": "eu-west-1", "TIER2_ACCESS_KEY_ID": "AKIAEXAMPLE", "TIER2_SECRET_ACCESS_KEY": "example"}
    svc_env = environment(interpolate_tree(raw, env)["services"]["airflow-scheduler"])
    s3 = json.loads(svc_env["AIRFLOW_CONN_TIERING_S3"])
    assert s3["extra"] == {"endpoint_url": "", "bucket": "my-company-tiering", "prefix": "tiering/",
                           "region_name": "eu-west-1"}
    assert (s3["login"], s3["password"]) == ("AKIAEXAMPLE", "example")
    assert svc_env["TIERING_S3_ENDPOINT_URL"] == ""


@pytest.mark.slow
def test_settings_resolve_through_airflow(raw, env_example, tmp_path):
    """The connections as Airflow reads them: TieringHook().get_settings() (what every DAG task does) and the
    Spark provider's master URL, in a subprocess so Airflow's import does not leak into other tests."""
    env = environment(interpolate_tree(raw, env_example)["services"]["airflow-scheduler"])
    probe = (
        "import json\n"
        "from tiering.jobs.hook import TieringHook\n"
        "from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook\n"
        "s = TieringHook().get_settings()\n"
        "print(json.dumps({'db': s.database_url_safe, 'bucket': s.bucket, 'prefix': s.prefix,\n"
        "  'endpoint': s.s3_endpoint_url, 'region': s.aws_region, 'tier1': str(s.tier1_root),\n"
        "  'key': s.aws_access_key_id, 'master': SparkSubmitHook(conn_id='spark_default')._connection['master']}))\n"
    )
    run_env = {k: v for k, v in env.items() if k.startswith(("AIRFLOW_CONN_", "TIERING_TIER1_ROOT"))}
    home = tmp_path / "airflow-home"
    home.mkdir()
    run_env.update(AIRFLOW_HOME=str(home), PATH=str(Path(sys.executable).parent), PYTHONPATH=str(REPO),
                   AIRFLOW__CORE__LOAD_EXAMPLES="False", AIRFLOW__LOGGING__LOGGING_LEVEL="ERROR")
    proc = subprocess.run([sys.executable, "-c", probe], env=run_env, capture_output=True, text=True, timeout=180,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    user = env_example["POSTGRES_USER"]
    assert got == {"db": f"postgresql+psycopg2://{user}:***@postgres:5432/tiering", "bucket": "tiering",
                   "prefix": "tiering/", "endpoint": "http://minio:9000", "region": "us-east-1",
                   "tier1": "/data/tier1", "key": env_example["MINIO_ROOT_USER"],
                   "master": "spark://spark-master:7077"}


# -- dependencies, health, one-shot services ------------------------------------------------------------

def test_depends_on_refer_to_defined_services(raw):
    defined = set(services(raw))
    graph = {}
    for name, svc in services(raw).items():
        deps = depends_on(svc)
        assert set(deps) <= defined, f"{name} depends on undefined {sorted(set(deps) - defined)}"
        assert set(deps.values()) <= DEPENDS_ON_CONDITIONS, f"{name}: bad condition in {deps}"
        graph[name] = set(deps)
    # no cycles: compose would refuse to start
    done, visiting = set(), set()

    def visit(node, path):
        assert node not in visiting, f"depends_on cycle: {' -> '.join(path + [node])}"
        if node in done:
            return
        visiting.add(node)
        for dep in graph[node]:
            visit(dep, path + [node])
        visiting.discard(node)
        done.add(node)

    for node in graph:
        visit(node, [])


def test_healthchecks(raw):
    for name in ("postgres", "minio"):
        check = services(raw)[name].get("healthcheck") or {}
        assert check.get("test") and not check.get("disable"), f"{name} has no healthcheck"
    # waiting for service_healthy on a service without a healthcheck would wait forever
    for name, svc in services(raw).items():
        for dep, condition in depends_on(svc).items():
            if condition == "service_healthy":
                assert services(raw)[dep].get("healthcheck", {}).get("test"), f"{name} waits for {dep}'s health"
            if condition == "service_completed_successfully":
                assert dep in ONE_SHOT, f"{name} waits for {dep} to exit, but it is not a one-shot service"


def test_one_shot_services(raw):
    for name in ONE_SHOT:
        assert str(services(raw)[name].get("restart", "no")) == "no", f"{name} must not be restarted"
    for name in LONG_RUNNING_AIRFLOW:
        deps = depends_on(services(raw)[name])
        assert deps.get("airflow-init") == "service_completed_successfully", f"{name} starts before airflow-init"
        assert deps.get("postgres") == "service_healthy"
    assert depends_on(services(raw)["airflow-init"]).get("postgres") == "service_healthy"
    assert depends_on(services(raw)["minio-init"]).get("minio") == "service_healthy"
    assert depends_on(services(raw)["airflow-scheduler"]).get("minio-init") == "service_completed_successfully"
    bucket_cmd = command_text(services(raw)["minio-init"])
    assert "mc mb" in bucket_cmd and "--ignore-existing" in bucket_cmd


def test_airflow_init_does_the_initialisation(compose):
    svc = services(compose)["airflow-init"]
    script_target = next(part for part in svc["command"] if part.endswith(".sh"))
    host = bind_targets(svc).get(script_target)
    assert host and host.is_file(), f"airflow-init runs {script_target}, which is not mounted from docker/"
    script = "\n".join(line for line in host.read_text().splitlines() if not line.lstrip().startswith("#"))
    pool = python_constant(REPO / "tiering" / "jobs" / "airflow_dags.py", "POOL")
    for step in ("airflow db migrate", f"airflow pools set {pool}", "tiering db upgrade",
                 "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE", "AIRFLOW_ADMIN_PASSWORD"):
        assert step in script, f"airflow-init.sh does not do: {step}"
    assert "set -euo pipefail" in script, "airflow-init must stop at the first failing step"
    env = environment(svc)
    assert env.get("AIRFLOW_ADMIN_PASSWORD"), "airflow-init needs AIRFLOW_ADMIN_PASSWORD"
    users = env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"]
    assert re.fullmatch(r"admin:admin(,\w+:\w+)*", users), users
    # the password file lives on a volume the api-server shares
    pw_dir = str(PurePosixPath(env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"]).parent)
    for name in ("airflow-init", "airflow-api-server"):
        vols = {target: source for kind, source, target in mounts(services(compose)[name]) if kind == "volume"}
        assert pw_dir in vols, f"{name}: the password directory {pw_dir} is not a shared volume"
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"] == environment(
        services(compose)["airflow-api-server"])["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"]


def test_scheduler_is_reachable_as_the_spark_driver(raw):
    """LocalExecutor runs spark-submit in the scheduler container: executors connect back to the driver
    by the name SPARK_LOCAL_HOSTNAME gives it (else it advertises 127.0.0.1, the default the operator sets)."""
    svc = services(raw)["airflow-scheduler"]
    assert environment(svc).get("SPARK_LOCAL_HOSTNAME") == svc.get("hostname") == "airflow-scheduler"


def test_published_ports(compose):
    expected = {"airflow-api-server": {8080}, "minio": {9000, 9001}, "spark-master": {7077, 8081}}
    for name, ports in expected.items():
        got = {target for _, _, target in published_ports(services(compose)[name])}
        assert ports <= got, f"{name} publishes {got}, expected {ports}"
    seen = {}
    for name, svc in services(compose).items():
        for address, host_port, _ in published_ports(svc):
            assert host_port not in seen, f"host port {host_port} published by {seen.get(host_port)} and {name}"
            seen[host_port] = name
            assert address, f"{name}: port {host_port} has no bind address (would listen on every interface)"


# -- settings file: every variable documented, no real secrets ------------------------------------------

def test_compose_starts_without_a_settings_file(raw):
    unset: set[str] = set()
    interpolate_tree(raw, {}, unset)  # raises on ${VAR:?...}
    assert not unset, f"variables without a default (compose would warn and use ''): {sorted(unset)}"


def test_env_example_documents_every_variable(raw, env_example):
    used = variables_in(raw)
    assert used - set(env_example) == set(), f"not in .env.example: {sorted(used - set(env_example))}"
    assert set(env_example) - used == set(), f"in .env.example, unused: {sorted(set(env_example) - used)}"


def test_no_real_secrets(raw, env_example):
    secret = re.compile(r"PASSWORD|SECRET|FERNET", re.I)
    for key, value in env_example.items():
        if secret.search(key):
            assert value == "" or value.startswith("change-me"), f".env.example: {key} is not a placeholder"
    for m in re.finditer(r"\$\{([A-Za-z_]\w*):?-([^${}]*)\}", COMPOSE_FILE.read_text()):
        if secret.search(m.group(1)):
            assert m.group(2) == "" or m.group(2).startswith("change-me"), f"default of {m.group(1)} is not a placeholder"


# -- with Docker ----------------------------------------------------------------------------------------

def _compose_plugin() -> str | None:
    docker = shutil.which("docker")
    if not docker:
        return None
    try:
        probe = subprocess.run([docker, "compose", "version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return docker if probe.returncode == 0 else None


def test_docker_compose_config_accepts_the_file():
    docker = _compose_plugin()
    if docker is None:
        pytest.skip("the Docker Compose plugin is not installed (`docker compose version` fails); "
                    "the structural tests above ran without it")
    proc = subprocess.run([docker, "compose", "-f", str(COMPOSE_FILE), "config", "-q"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
