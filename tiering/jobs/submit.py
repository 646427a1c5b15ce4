"""What a tiering job hands spark-submit, per kind of master: its environment, the executors' Python, and
the package archive (`--py-files`). Plain functions (no Airflow import) so tests check them directly.

- Settings and secrets reach the job through spark-submit's *process environment*: with a local or
  standalone master the driver runs inside that process (client mode), and executors get the settings in
  the task closure. Never argv.
- The Spark provider turns `env_vars` into `--conf spark.yarn.appMasterEnv.K=V` on YARN and
  `--conf spark.kubernetes.driverEnv.K=V` on Kubernetes: argv, and the command line it logs. So on YARN only
  non-secret settings are passed, and a connection that carries a secret is refused (credentials reach the
  cluster another way: see README, Running on a cluster). Kubernetes masters are refused: untested here.
- `SPARK_LOCAL_IP` is not set: on a cluster the driver must advertise an address executors can reach, which
  only the operator of the Airflow worker knows (README).
"""
from __future__ import annotations

import hashlib
import os
import tempfile
import zipfile
from pathlib import Path
from typing import Mapping

from tiering.database_url import has_password
from tiering.errors import BadInput, ConfigError

# Settings whose value is (or contains) a secret. The database URL is passed on YARN only without a password.
SECRET_VARS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
EXECUTOR_PYTHON_VAR = "TIERING_EXECUTOR_PYTHON"
EXECUTOR_PYTHON_EXTRA = "executor-python"


def master_kind(master: str) -> str:
    """local | standalone | yarn | k8s, tested the way the Spark provider tests it (substrings), so a
    master the provider treats as YARN is never taken for a standalone one here."""
    if "k8s" in master:
        return "k8s"
    if "yarn" in master:
        return "yarn"
    if master.startswith("local"):
        return "local"
    if master.startswith("spark://"):
        return "standalone"
    raise BadInput(f"spark_default master {master!r} is not local[N], spark://HOST:PORT or yarn")


def job_environment(settings_env: Mapping[str, str], master: str, deploy_mode: str | None,
                    executor_python: str, driver_python: str, path: str) -> dict[str, str]:
    """`env_vars` for the SparkSubmitOperator of one job; BadInput (a sentence for the task log) when this
    master cannot be given the settings without putting a secret in spark-submit's argv."""
    kind = master_kind(master)
    if kind == "k8s":
        raise BadInput(f"spark_default master {master!r}: Kubernetes is not supported by tiering's DAGs (not "
                       f"tested; the Spark provider would pass the settings as --conf spark.kubernetes."
                       f"driverEnv.* in spark-submit's argv). Use a standalone or YARN master.")
    if deploy_mode == "cluster" and kind == "standalone":
        raise BadInput("spark_default: Spark standalone runs Python applications in client mode only; remove "
                       "deploy-mode=cluster from the connection's extra")
    env = dict(settings_env)
    if kind == "yarn":
        leaks = [name for name in SECRET_VARS if env.get(name)]
        if has_password(env.get("TIERING_DATABASE_URL", "")):
            leaks.insert(0, "the tiering_metadata password")
        if leaks:
            raise BadInput(f"spark_default is a YARN master: the Spark provider would put {', '.join(leaks)} "
                           f"into spark-submit's argv (--conf spark.yarn.appMasterEnv.*). Remove them from the "
                           f"connections and give the cluster its credentials itself: an instance role for "
                           f"S3, PGPASSFILE (a mounted secret) for PostgreSQL (README, Running on a cluster)")
        return {**env, "PYSPARK_PYTHON": executor_python}
    return {**env, "PYSPARK_PYTHON": executor_python, "PYSPARK_DRIVER_PYTHON": driver_python, "PATH": path}


def executor_python(extra: Mapping[str, object], environ: Mapping[str, str], default: str) -> str:
    """The Python executors run: the spark_default extra `executor-python`, else TIERING_EXECUTOR_PYTHON,
    else `default` (the Airflow worker's own interpreter: right for local masters and for clusters whose
    workers have the same virtualenv at the same path)."""
    value = extra.get(EXECUTOR_PYTHON_EXTRA) or environ.get(EXECUTOR_PYTHON_VAR) or default
    if not isinstance(value, str) or not value.strip() or any(c in value for c in "\0\n\r"):
        raise ConfigError(f"{EXECUTOR_PYTHON_EXTRA} / {EXECUTOR_PYTHON_VAR} must be the path of a Python "
                          f"executable")
    return value.strip()


def py_files_archive(cache_dir: Path | None = None) -> Path:
    """A zip of the installed `tiering` package for `--py-files`, built from the code this process runs
    (wherever the DAGs are: a checkout, site-packages, an image), named by its content hash and written
    atomically, so concurrent tasks share one archive and a code change gets a new one."""
    import tiering

    pkg = Path(tiering.__file__).resolve().parent
    files = sorted(p for p in pkg.rglob("*") if p.suffix in (".py", ".proto") and "__pycache__" not in p.parts)
    digest = hashlib.sha256()
    for p in files:
        digest.update(str(p.relative_to(pkg)).encode() + b"\0" + p.read_bytes() + b"\0")
    cache = Path(cache_dir or Path(tempfile.gettempdir()) / f"tiering-py-files-{os.getuid()}")
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / f"tiering-{digest.hexdigest()[:16]}.zip"
    if target.is_file():
        return target
    fd, tmp = tempfile.mkstemp(dir=cache, suffix=".zip.tmp")
    try:
        with os.fdopen(fd, "wb") as out, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
            for p in files:
                # fixed timestamps: the same code gives the same bytes
                info = zipfile.ZipInfo(str(Path("tiering") / p.relative_to(pkg)), (2020, 1, 1, 0, 0, 0))
                info.compress_type = zipfile.ZIP_DEFLATED
                z.writestr(info, p.read_bytes())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
