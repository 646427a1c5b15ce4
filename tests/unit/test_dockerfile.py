"""docker/Dockerfile and its build context, checked without a Docker engine."""
from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

from tests.unit.docker_files import python_constant

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
DOCKERFILE = DOCKER / "Dockerfile"
DOCKERIGNORE = DOCKER / "Dockerfile.dockerignore"

def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    assert DOCKERFILE.is_file(), f"{DOCKERFILE} is missing"
    out, current = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#") or (not stripped and not current):
            continue
        current += " " + stripped.rstrip("\\").strip() if current else stripped.rstrip("\\").strip()
        if not stripped.endswith("\\"):
            word, _, rest = current.partition(" ")
            out.append((word.upper(), rest.strip()))
            current = ""
    return out


def test_dockerfile_base_image_is_airflow_3_3_2():
    instructions = dockerfile_instructions()
    froms = [args for word, args in instructions if word == "FROM"]
    assert len(froms) == 1 and froms[0].startswith("apache/airflow:3.3.2"), froms
    pin = re.search(r"^apache-airflow(\[[^\]]*\])?==(\S+)", (REPO / "requirements.txt").read_text(), re.M)
    assert pin and froms[0].split(":", 1)[1].split("-")[0] == pin.group(2), "image and requirements.txt disagree"


def test_dockerfile_installs_jre_jdbc_and_requirements():
    instructions = dockerfile_instructions()
    users = []  # the user in effect at each RUN
    user = "root"
    for word, args in instructions:
        if word == "USER":
            user = args
        elif word == "RUN":
            users.append((user, args))
    jdbc = python_constant(REPO / "tiering" / "jobs" / "airflow_dags.py", "JDBC_JAR")
    apt = [args for u, args in users if "apt-get install" in args]
    assert apt and all(u == "root" for u, args in users if "apt-get" in args), "apt-get must run as root"
    assert "openjdk-17-jre-headless" in apt[0] and "libpostgresql-jdbc-java" in apt[0]
    assert jdbc == "/usr/share/java/postgresql.jar" and jdbc in apt[0], "the JDBC jar is not where the DAGs look"
    pip = [(u, args) for u, args in users if "pip install" in args]
    req = [(u, args) for u, args in pip if "-r " in args and "requirements.txt" in args]
    assert req, "requirements.txt is not installed"
    assert all(u == "airflow" for u, _ in pip), "pip must run as the airflow user"
    assert '"apache-airflow==3.3.2"' in req[0][1], "pin apache-airflow to the base image's version"
    assert "spark-submit --version" in req[0][1], "check that spark-submit from the pyspark wheel is on PATH"
    assert any("--no-deps" in args and "/opt/tiering" in args for _, args in pip), "the tiering package"
    assert user == "airflow", "the image must end as the airflow user"
    copies = " ".join(args for word, args in instructions if word == "COPY")
    for src in ("requirements.txt", "pyproject.toml", "sql", "tiering"):
        assert re.search(rf"(^|\s){re.escape(src)}(\s|$)", copies), f"COPY of {src} missing"


def dockerignore_excludes(rel: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents decides."""
    parts = PurePosixPath(rel).parts
    candidates = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    excluded = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern.lstrip("!").strip("/")
        regex = re.escape(pat).replace(r"\*\*/", "(.*/)?").replace(r"\*\*", ".*").replace(r"\*", "[^/]*")
        regex = regex.replace(r"\?", "[^/]")
        if any(re.fullmatch(regex, c) for c in candidates):
            excluded = not negate
    return excluded


def test_build_context_sends_what_the_dockerfile_copies_and_no_more():
    patterns = [line.strip() for line in DOCKERIGNORE.read_text().splitlines()
                if line.strip() and not line.strip().startswith("#")]
    for word, args in dockerfile_instructions():
        if word != "COPY":
            continue
        sources = [a for a in args.split() if not a.startswith("--")][:-1]
        for src in sources:
            assert (REPO / src).exists(), f"COPY {src}: not in the repository"
            assert not dockerignore_excludes(src, patterns), f"COPY {src}: excluded by {DOCKERIGNORE.name}"
    for heavy in (".venv/bin/python", ".local/env", ".git/HEAD", "build/tiering.zip",
                  "tiering/__pycache__/x.pyc", "tests/unit/test_config.py"):
        assert dockerignore_excludes(heavy, patterns), f"{heavy} would be sent to the Docker daemon"
