"""kokoro-deploy against moto's server (real boto3 clients over loopback HTTP)."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto.core.responses import ActionResult
from moto.sagemaker.models import FakeEndpoint, FakeEndpointConfig, SageMakerModelBackend
from moto.sagemaker.responses import SageMakerResponse
from moto.server import ThreadedMotoServer

from deploy.cli import main
from deploy.model_data import upload
from deploy.sagemaker import GPU_AMI_VERSION, EndpointSpec, default_ami_version, deploy, teardown
from model_server.engines.checkpoint import locate

ROLE = "arn:aws:iam::123456789012:role/SageMakerExecution"


def _update_endpoint(
    self: SageMakerModelBackend, endpoint_name: str, endpoint_config_name: str
) -> FakeEndpoint:
    endpoint: FakeEndpoint = self.endpoints[endpoint_name]
    config = self.describe_endpoint_config(endpoint_config_name)
    endpoint.endpoint_config_name = endpoint_config_name
    endpoint.production_variants = endpoint._process_production_variants(
        config["ProductionVariants"]
    )
    return endpoint


def _update_endpoint_action(self: SageMakerResponse) -> ActionResult:
    endpoint = _update_endpoint(
        self.sagemaker_backend,
        self._get_param("EndpointName"),
        self._get_param("EndpointConfigName"),
    )
    return ActionResult({"EndpointArn": endpoint.arn})


@pytest.fixture
def moto_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    # moto's endpoint-config check predates the g5 family; SageMaker accepts ml.g5.*
    original = FakeEndpointConfig.validate_instance_type

    def allow_g5(self: FakeEndpointConfig, instance_type: str) -> None:
        if not instance_type.startswith("ml.g5."):
            original(self, instance_type)

    monkeypatch.setattr(FakeEndpointConfig, "validate_instance_type", allow_g5)
    # moto has no UpdateEndpoint: switch the endpoint to the new config, as SageMaker ends up
    monkeypatch.setattr(SageMakerModelBackend, "update_endpoint", _update_endpoint, raising=False)
    monkeypatch.setattr(
        SageMakerResponse, "update_endpoint", _update_endpoint_action, raising=False
    )
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": url,
        "AWS_EC2_METADATA_DISABLED": "true",
    }.items():
        monkeypatch.setenv(name, value)
    yield url
    server.stop()


def clients() -> tuple[Any, Any]:
    return boto3.client("sagemaker"), boto3.client("application-autoscaling")


def spec(**overrides: Any) -> EndpointSpec:
    base: dict[str, Any] = {
        "name": "kokoro-tts",
        "image_uri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/kokoro:1.0",
        "model_data_url": "s3://bucket/kokoro/model.tar.gz",
        "role_arn": ROLE,
        "environment": {"MODEL_SERVER_ENGINE": "onnx"},
    }
    return EndpointSpec(**{**base, **overrides})


def test_deploy_creates_everything_on_g5(moto_server: str) -> None:
    sm, aas = clients()
    done = deploy(spec(), sm, aas)
    assert (done["model_action"], done["config_action"], done["endpoint_action"]) == (
        "created",
        "created",
        "created",
    )
    assert done["status"] == "InService"
    endpoint = sm.describe_endpoint(EndpointName="kokoro-tts")
    config = sm.describe_endpoint_config(EndpointConfigName=endpoint["EndpointConfigName"])
    (variant,) = config["ProductionVariants"]
    assert (variant["InstanceType"], variant["InitialInstanceCount"]) == ("ml.g5.xlarge", 1)
    model = sm.describe_model(ModelName=variant["ModelName"])
    assert model["PrimaryContainer"]["Image"].endswith("kokoro:1.0")
    assert model["PrimaryContainer"]["ModelDataUrl"] == "s3://bucket/kokoro/model.tar.gz"
    assert model["ExecutionRoleArn"] == ROLE
    (target,) = aas.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"]
    assert (target["ResourceId"], target["MinCapacity"], target["MaxCapacity"]) == (
        "endpoint/kokoro-tts/variant/AllTraffic",
        1,
        4,
    )
    assert variant["RoutingConfig"] == {"RoutingStrategy": "LEAST_OUTSTANDING_REQUESTS"}
    policies = aas.describe_scaling_policies(ServiceNamespace="sagemaker")["ScalingPolicies"]
    tracked = {
        p["TargetTrackingScalingPolicyConfiguration"]["PredefinedMetricSpecification"][
            "PredefinedMetricType"
        ]: p["TargetTrackingScalingPolicyConfiguration"]["TargetValue"]
        for p in policies
        if p["PolicyType"] == "TargetTrackingScaling"
    }
    assert tracked == {
        "SageMakerVariantInvocationsPerInstance": 20.0,
        "SageMakerVariantConcurrentRequestsPerModelHighResolution": 8.0,
    }


def test_rerunning_is_safe_and_changes_update_in_place(moto_server: str) -> None:
    sm, aas = clients()
    first = deploy(spec(), sm, aas)
    again = deploy(spec(), sm, aas)
    assert (again["model_action"], again["config_action"], again["endpoint_action"]) == (
        "reused",
        "reused",
        "unchanged",
    )
    bigger = deploy(spec(instance_type="ml.g5.2xlarge", max_instances=8), sm, aas)
    assert (bigger["model_action"], bigger["config_action"], bigger["endpoint_action"]) == (
        "reused",
        "created",
        "updated",
    )
    assert bigger["config"] != first["config"]
    endpoint = sm.describe_endpoint(EndpointName="kokoro-tts")
    assert endpoint["EndpointConfigName"] == bigger["config"]
    (target,) = aas.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"]
    assert target["MaxCapacity"] == 8


def test_teardown_removes_it_all_and_is_safe_to_repeat(moto_server: str) -> None:
    sm, aas = clients()
    deploy(spec(), sm, aas)
    deploy(spec(instance_type="ml.g5.2xlarge"), sm, aas)
    removed = teardown("kokoro-tts", sm, aas)
    assert "endpoint kokoro-tts" in removed
    assert sum(r.startswith("endpoint config") for r in removed) == 2
    assert sum(r.startswith("model ") for r in removed) == 1
    assert sm.list_endpoints()["Endpoints"] == []
    assert sm.list_models()["Models"] == []
    assert aas.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"] == []
    assert teardown("kokoro-tts", sm, aas) == []


def test_gpu_instances_get_the_newer_driver_ami() -> None:
    assert default_ami_version("ml.g5.xlarge") == GPU_AMI_VERSION
    assert default_ami_version("ml.g6e.2xlarge") == GPU_AMI_VERSION
    assert default_ami_version("ml.p4d.24xlarge") == GPU_AMI_VERSION
    assert default_ami_version("ml.c7i.4xlarge") is None
    assert default_ami_version("ml.m5.xlarge") is None


def test_cli(moto_server: str, capsys: pytest.CaptureFixture[str]) -> None:
    main(
        [
            "sagemaker",
            "--name",
            "kokoro-cli",
            "--image-uri",
            "img:1",
            "--role-arn",
            ROLE,
            "--env",
            "MODEL_SERVER_ENGINE=torch",
            "--max-instances",
            "3",
        ]
    )
    out = capsys.readouterr().out
    assert "endpoint_action: created" in out
    assert "status: InService" in out
    sm, _ = clients()
    endpoint = sm.describe_endpoint(EndpointName="kokoro-cli")
    config = sm.describe_endpoint_config(EndpointConfigName=endpoint["EndpointConfigName"])
    # ml.g5's default AMI has driver 470, too old for the GPU image's CUDA 13 torch
    assert config["ProductionVariants"][0]["InferenceAmiVersion"] == GPU_AMI_VERSION
    main(["teardown", "--name", "kokoro-cli"])
    assert "removed endpoint kokoro-cli" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        main(["sagemaker", "--name", "x", "--image-uri", "i", "--role-arn", ROLE, "--env", "BAD"])


def _checkpoint_layout(root: Path) -> Path:
    """The files of a checkpoint directory (content is the torch engine's business)."""
    (root / "voices").mkdir(parents=True)
    (root / "config.json").write_text('{"vocab": {}}')
    (root / "kokoro-v1_0.pth").write_bytes(bytes(range(256)) * 64)
    (root / "voices" / "af_heart.pt").write_bytes(b"pack-a")
    (root / "voices" / "bf_emma.pt").write_bytes(b"pack-b")
    (root / "README.md").write_text("not model data")
    (root / "samples").mkdir()
    (root / "samples" / "x.wav").write_bytes(b"RIFF")
    return root


def test_model_data_is_the_checkpoint_at_the_archive_root(
    moto_server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = _checkpoint_layout(tmp_path / "Kokoro-82M")
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="models")
    out = tmp_path / "model.tar.gz"
    main(
        [
            "model-data",
            "--model-dir",
            str(source),
            "--out",
            str(out),
            "--upload",
            "s3://models/kokoro/model.tar.gz",
        ]
    )
    assert "--model-data s3://models/kokoro/model.tar.gz" in capsys.readouterr().out
    uploaded = s3.get_object(Bucket="models", Key="kokoro/model.tar.gz")["Body"].read()
    assert uploaded == out.read_bytes()
    # what SageMaker does with it: unpack into /opt/ml/model
    opt_ml_model = tmp_path / "opt-ml-model"
    with tarfile.open(fileobj=io.BytesIO(uploaded)) as tar:
        assert sorted(tar.getnames()) == [
            "config.json",
            "kokoro-v1_0.pth",
            "voices/af_heart.pt",
            "voices/bf_emma.pt",
        ]
        tar.extractall(opt_ml_model, filter="data")
    files = locate(opt_ml_model)
    assert files.weights.read_bytes() == (source / "kokoro-v1_0.pth").read_bytes()
    assert files.voices_dir == opt_ml_model / "voices"


def test_model_data_refuses_what_the_server_would_refuse(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = _checkpoint_layout(tmp_path / "ckpt")
    (source / "config.json").unlink()
    with pytest.raises(SystemExit) as exit_info:
        main(["model-data", "--model-dir", str(source), "--out", str(tmp_path / "m.tar.gz")])
    assert exit_info.value.code == 1
    assert "has no config.json" in capsys.readouterr().err
    assert not (tmp_path / "m.tar.gz").exists()
    with pytest.raises(ValueError, match="s3://bucket/key"):
        upload(tmp_path / "m.tar.gz", "s3://bucket-only", None)
