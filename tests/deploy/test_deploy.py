"""kokoro-deploy against moto's server (real boto3 clients over loopback HTTP), and the hardening
of docker/compose*.yaml and k8s/ (GitHub issue #11 item 6), checked statically on the parsed files
and kustomize's renders: no Docker engine, no cluster, no network."""

from __future__ import annotations

import dataclasses
import io
import re
import subprocess
import sys
import tarfile
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

import boto3
import orjson
import pytest
import yaml
from botocore.exceptions import ClientError
from dockerfile_parse import DockerfileParser
from moto.core.responses import ActionResult
from moto.iam.responses import IamResponse
from moto.sagemaker.models import FakeEndpoint, FakeEndpointConfig, SageMakerModelBackend
from moto.sagemaker.responses import SageMakerResponse
from moto.server import ThreadedMotoServer

from deploy.cli import main
from deploy.model_data import upload
from deploy.preflight import check_role
from deploy.sagemaker import (
    GPU_AMI_VERSION,
    DeployError,
    EndpointSpec,
    check_spec,
    default_ami_version,
    deploy,
    teardown,
)
from gateway.config import Settings as GatewaySettings
from model_server.config import Settings as ModelServerSettings
from model_server.engines.checkpoint import locate
from tests.support.stubbed_aws import StubbedClients

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


def _simulate_principal_policy(self: IamResponse) -> ActionResult:
    """moto has no SimulatePrincipalPolicy: every action is allowed (the policy logic is
    IAM's; the decisions kokoro-deploy draws from it are tested with Stubber below)."""
    results = [
        {"EvalActionName": action, "EvalResourceName": resource, "EvalDecision": "allowed"}
        for action in self._get_param("ActionNames", [])
        for resource in self._get_param("ResourceArns", [])
    ]
    return ActionResult({"EvaluationResults": results, "IsTruncated": False})


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
    monkeypatch.setattr(
        IamResponse, "simulate_principal_policy", _simulate_principal_policy, raising=False
    )
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    # moto's backends live in this process: each test starts from an empty account
    urllib.request.urlopen(urllib.request.Request(f"{url}/moto-api/reset", method="POST"))
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


def clients() -> tuple[Any, Any, Any]:
    return (
        boto3.client("sagemaker"),
        boto3.client("application-autoscaling"),
        boto3.client("cloudwatch"),
    )


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
    sm, aas, cw = clients()
    done = deploy(spec(), sm, aas, cw)
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
    sm, aas, cw = clients()
    first = deploy(spec(), sm, aas, cw)
    again = deploy(spec(), sm, aas, cw)
    assert (again["model_action"], again["config_action"], again["endpoint_action"]) == (
        "reused",
        "reused",
        "unchanged",
    )
    bigger = deploy(spec(instance_type="ml.g5.2xlarge", max_instances=8), sm, aas, cw)
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
    sm, aas, cw = clients()
    deploy(spec(), sm, aas, cw)
    deploy(spec(instance_type="ml.g5.2xlarge"), sm, aas, cw)
    removed = teardown("kokoro-tts", sm, aas, cw)
    assert "endpoint kokoro-tts" in removed
    assert sum(r.startswith("endpoint config") for r in removed) == 2
    assert sum(r.startswith("model ") for r in removed) == 1
    assert sm.list_endpoints()["Endpoints"] == []
    assert sm.list_models()["Models"] == []
    assert aas.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"] == []
    assert teardown("kokoro-tts", sm, aas, cw) == []


def test_gpu_instances_get_the_newer_driver_ami() -> None:
    assert default_ami_version("ml.g5.xlarge") == GPU_AMI_VERSION
    assert default_ami_version("ml.g6e.2xlarge") == GPU_AMI_VERSION
    assert default_ami_version("ml.p4d.24xlarge") == GPU_AMI_VERSION
    assert default_ami_version("ml.c7i.4xlarge") is None
    assert default_ami_version("ml.m5.xlarge") is None


TRUST = {
    "Version": "2012-10-17",
    "Statement": [
        {
            "Effect": "Allow",
            "Principal": {"Service": "sagemaker.amazonaws.com"},
            "Action": "sts:AssumeRole",
        }
    ],
}


def execution_role(trust: dict[str, Any] = TRUST) -> str:
    arn: str = boto3.client("iam").create_role(
        RoleName="SageMakerExecution", AssumeRolePolicyDocument=orjson.dumps(trust).decode()
    )["Role"]["Arn"]
    return arn


def test_cli(moto_server: str, capsys: pytest.CaptureFixture[str]) -> None:
    role = execution_role()
    main(
        [
            "sagemaker",
            "--name",
            "kokoro-cli",
            "--image-uri",
            "img:1",
            "--model-data",
            "s3://bucket/kokoro/model.tar.gz",
            "--role-arn",
            role,
            "--env",
            "MODEL_SERVER_ENGINE=torch",
            "--max-instances",
            "3",
        ]
    )
    captured = capsys.readouterr()
    assert "endpoint_action: created" in captured.out
    assert "status: InService" in captured.out
    assert "img:1 is not an ECR image" in captured.err
    sm, _, _ = clients()
    endpoint = sm.describe_endpoint(EndpointName="kokoro-cli")
    config = sm.describe_endpoint_config(EndpointConfigName=endpoint["EndpointConfigName"])
    # ml.g5's default AMI has driver 470, too old for the GPU image's CUDA 13 torch
    assert config["ProductionVariants"][0]["InferenceAmiVersion"] == GPU_AMI_VERSION
    main(["teardown", "--name", "kokoro-cli"])
    assert "removed endpoint kokoro-cli" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        main(["sagemaker", "--name", "x", "--image-uri", "i", "--role-arn", ROLE, "--env", "BAD"])


# --- redeploys, teardown, images by digest, refusals: call order checked with Stubber ---------
# Stubber checks each request against botocore's service model and each client's call order;
# `Calls` records the order across clients.

NOW = datetime(2026, 12, 1, tzinfo=UTC)


class Calls(StubbedClients):
    """Stubbed sagemaker, application-autoscaling, cloudwatch, iam and sts clients."""

    def __init__(self) -> None:
        super().__init__(("sagemaker", "application-autoscaling", "cloudwatch", "iam", "sts"))

    def expect(self, service: str, method: str, response: dict[str, Any], **params: Any) -> None:
        self.stubs[service].add_response(method, response, params or None)

    def refuse(self, service: str, method: str, code: str, message: str) -> None:
        self.stubs[service].add_client_error(method, code, message, 400)

    def deploy(self, endpoint_spec: EndpointSpec) -> dict[str, Any]:
        c = self.clients
        return deploy(endpoint_spec, c["sagemaker"], c["application-autoscaling"], c["cloudwatch"])


def _endpoint(name: str, status: str, config: str, **extra: Any) -> dict[str, Any]:
    return {
        "EndpointName": name,
        "EndpointArn": f"arn:aws:sagemaker:us-east-1:123456789012:endpoint/{name}",
        "EndpointConfigName": config,
        "EndpointStatus": status,
        "CreationTime": NOW,
        "LastModifiedTime": NOW,
        **extra,
    }


def _config(name: str, instance_type: str, count: int = 1) -> dict[str, Any]:
    variant = {
        "VariantName": "AllTraffic",
        "ModelName": "kokoro-tts-model",
        "InstanceType": instance_type,
        "InitialInstanceCount": count,
    }
    return {
        "EndpointConfigName": name,
        "EndpointConfigArn": f"arn:aws:sagemaker:us-east-1:123456789012:endpoint-config/{name}",
        "ProductionVariants": [variant],
        "CreationTime": NOW,
    }


UPDATE_START = [
    ("sagemaker", "DescribeEndpoint"),
    ("sagemaker", "DescribeModel"),
    ("sagemaker", "DescribeEndpointConfig"),
    ("sagemaker", "CreateEndpointConfig"),
    ("cloudwatch", "PutMetricAlarm"),
    ("cloudwatch", "PutMetricAlarm"),
    ("sagemaker", "DescribeEndpointConfig"),
]
UPDATE_END = [
    ("sagemaker", "UpdateEndpoint"),
    ("sagemaker", "DescribeEndpoint"),  # the waiter
    ("sagemaker", "DescribeEndpoint"),
    ("application-autoscaling", "RegisterScalableTarget"),
    ("application-autoscaling", "PutScalingPolicy"),
    ("application-autoscaling", "PutScalingPolicy"),
]


@pytest.mark.parametrize(
    ("live_type", "live_count", "paused", "excluded"),
    [
        ("ml.g5.xlarge", 1, True, False),  # instance type changes: scaling off, then on again
        ("ml.g5.2xlarge", 1, False, False),  # same type: autoscaling stays registered
        ("ml.g5.2xlarge", 3, False, True),  # --initial-count changed: that count applies
    ],
)
def test_an_update_keeps_live_properties_and_pauses_scaling_around_a_type_change(
    live_type: str, live_count: int, paused: bool, excluded: bool
) -> None:
    calls = Calls()
    new = spec(instance_type="ml.g5.2xlarge", max_instances=6)
    live = _endpoint(new.name, "InService", "kokoro-tts-old")
    calls.expect("sagemaker", "describe_endpoint", live)
    model = {
        "ModelName": new.model_name,
        "ModelArn": "arn:aws:sagemaker:us-east-1:123456789012:model/m",
        "CreationTime": NOW,
    }
    calls.expect("sagemaker", "describe_model", model)
    calls.refuse(
        "sagemaker",
        "describe_endpoint_config",
        "ValidationException",
        f"Could not find endpoint configuration {new.config_name}.",
    )
    calls.expect(
        "sagemaker",
        "create_endpoint_config",
        {"EndpointConfigArn": "arn:aws:sagemaker:us-east-1:123456789012:endpoint-config/c"},
    )
    for _ in range(2):
        calls.expect("cloudwatch", "put_metric_alarm", {})
    calls.expect(
        "sagemaker", "describe_endpoint_config", _config("kokoro-tts-old", live_type, live_count)
    )
    if live_type != new.instance_type:
        target = {
            "ServiceNamespace": "sagemaker",
            "ResourceId": new.resource_id,
            "ScalableDimension": "sagemaker:variant:DesiredInstanceCount",
            "MinCapacity": 1,
            "MaxCapacity": 4,
            "RoleARN": "arn:aws:iam::123456789012:role/aws-service-role/x",
            "CreationTime": NOW,
        }
        calls.expect(
            "application-autoscaling", "describe_scalable_targets", {"ScalableTargets": [target]}
        )
        calls.expect("application-autoscaling", "deregister_scalable_target", {})
    alarms = {"Alarms": [{"AlarmName": "kokoro-tts-5xx"}, {"AlarmName": "kokoro-tts-latency"}]}
    update: dict[str, Any] = {
        "EndpointName": "kokoro-tts",
        "EndpointConfigName": new.config_name,
        "RetainAllVariantProperties": True,
        "DeploymentConfig": {
            "BlueGreenUpdatePolicy": {
                "TrafficRoutingConfiguration": {
                    "Type": "CANARY",
                    "CanarySize": {"Type": "CAPACITY_PERCENT", "Value": 25},
                    "WaitIntervalInSeconds": 300,
                },
                "TerminationWaitInSeconds": 300,
            },
            "AutoRollbackConfiguration": alarms,
        },
    }
    if excluded:
        update["ExcludeRetainedVariantProperties"] = [
            {"VariantPropertyType": "DesiredInstanceCount"}
        ]
    calls.expect("sagemaker", "update_endpoint", {"EndpointArn": live["EndpointArn"]}, **update)
    for _ in range(2):
        calls.expect("sagemaker", "describe_endpoint", {**live, "EndpointStatus": "InService"})
    calls.expect("application-autoscaling", "register_scalable_target", {})
    for _ in range(2):
        calls.expect(
            "application-autoscaling",
            "put_scaling_policy",
            {"PolicyARN": "arn:aws:autoscaling:us-east-1:123456789012:scalingPolicy:p"},
        )
    done = calls.deploy(new)
    calls.done()
    scaling_off = [
        ("application-autoscaling", "DescribeScalableTargets"),
        ("application-autoscaling", "DeregisterScalableTarget"),
    ]
    assert calls.order == UPDATE_START + (scaling_off if paused else []) + UPDATE_END
    assert done["endpoint_action"] == "updated"
    assert ("autoscaling_paused" in done) is paused


def test_the_rollback_alarms_watch_the_endpoints_5xx_and_latency(moto_server: str) -> None:
    sm, aas, cw = clients()
    deploy(spec(latency_alarm_ms=3000, deployment="rolling"), sm, aas, cw)
    alarms = {a["AlarmName"]: a for a in cw.describe_alarms()["MetricAlarms"]}
    assert set(alarms) == {"kokoro-tts-5xx", "kokoro-tts-latency"}
    errors, latency = alarms["kokoro-tts-5xx"], alarms["kokoro-tts-latency"]
    assert (errors["Namespace"], errors["MetricName"], errors["Statistic"]) == (
        "AWS/SageMaker",
        "Invocation5XXErrors",
        "Sum",
    )
    assert (latency["MetricName"], latency["ExtendedStatistic"], latency["Threshold"]) == (
        "ModelLatency",
        "p90",
        3_000_000.0,  # ModelLatency is in microseconds
    )
    for alarm in (errors, latency):
        assert {d["Name"]: d["Value"] for d in alarm["Dimensions"]} == {
            "EndpointName": "kokoro-tts",
            "VariantName": "AllTraffic",
        }


@pytest.mark.parametrize(
    ("status", "says"),
    [
        ("Updating", "is Updating: wait until it is InService"),
        ("Creating", "is Creating: wait until it is InService"),
        ("Failed", "is Failed (CannotStartContainerError): SageMaker cannot update it"),
    ],
)
def test_a_busy_or_failed_endpoint_is_refused_before_anything_is_created(
    status: str, says: str
) -> None:
    calls = Calls()
    reason = {"FailureReason": "CannotStartContainerError"} if status == "Failed" else {}
    calls.expect(
        "sagemaker", "describe_endpoint", _endpoint("kokoro-tts", status, "kokoro-tts-a", **reason)
    )
    with pytest.raises(DeployError, match=re.escape(says)):
        calls.deploy(spec())
    assert calls.order == [("sagemaker", "DescribeEndpoint")]


def test_only_could_not_find_means_absent() -> None:
    calls = Calls()
    calls.refuse("sagemaker", "describe_endpoint", "ValidationException", "Could not find endpoint")
    calls.refuse(
        "sagemaker", "describe_model", "ValidationException", "1 validation error detected"
    )
    with pytest.raises(ClientError, match="1 validation error"):
        calls.deploy(spec())
    assert ("sagemaker", "CreateModel") not in calls.order


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ({"name": "k" * 53}, "has 53 characters; at most 52"),
        ({"model_data_url": None}, "pass --model-data"),
    ],
)
def test_what_would_fail_later_is_refused_up_front(
    overrides: dict[str, Any], says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = Calls()
    with pytest.raises(DeployError, match=says):
        calls.deploy(spec(environment={}, **overrides))
    assert calls.order == []
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    argv = ["sagemaker", "--name", "k" * 53, "--image-uri", "i", "--role-arn", ROLE]
    with pytest.raises(SystemExit) as exit_info:  # the CLI says it in one line
        main(argv)
    assert exit_info.value.code == 1


def test_the_cpu_image_needs_no_model_data() -> None:
    check_spec(spec(model_data_url=None, environment={"MODEL_SERVER_ENGINE": "onnx"}))
    check_spec(spec(model_data_url=None, environment={}, instance_type="ml.c7i.4xlarge"))


def test_teardown_removes_exactly_what_this_endpoint_created(
    moto_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`kokoro` beside `kokoro-staging` (whose names it prefixes), one page per item, and an
    endpoint of someone else's that uses one of kokoro's configs."""
    monkeypatch.setattr("deploy.sagemaker.PAGE_SIZE", 1)
    sm, aas, cw = clients()
    deploy(spec(name="kokoro"), sm, aas, cw)
    deploy(spec(name="kokoro", instance_type="ml.g5.2xlarge"), sm, aas, cw)
    staging = deploy(spec(name="kokoro-staging"), sm, aas, cw)
    kept = deploy(spec(name="kokoro", instance_type="ml.g5.4xlarge"), sm, aas, cw)["config"]
    sm.create_endpoint(EndpointName="borrower", EndpointConfigName=kept)
    removed = teardown("kokoro", sm, aas, cw)
    assert "endpoint kokoro" in removed
    assert sum(r.startswith("endpoint config ") for r in removed) == 2  # not the borrowed one
    assert not [r for r in removed if "staging" in r]
    assert {"alarm kokoro-5xx", "alarm kokoro-latency"} <= set(removed)
    left = {e["EndpointName"] for e in sm.list_endpoints()["Endpoints"]}
    assert left == {"kokoro-staging", "borrower"}
    assert sm.describe_endpoint_config(EndpointConfigName=staging["config"])
    assert sm.describe_model(ModelName=staging["model"])
    assert sm.describe_endpoint_config(EndpointConfigName=kept)
    assert sm.describe_model(ModelName=spec(name="kokoro").model_name)  # the borrower's model
    (target,) = aas.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"]
    assert target["ResourceId"] == "endpoint/kokoro-staging/variant/AllTraffic"
    assert {a["AlarmName"] for a in cw.describe_alarms()["MetricAlarms"]} == {
        "kokoro-staging-5xx",
        "kokoro-staging-latency",
    }


def _push(ecr: Any, tag: str, layer: str) -> str:
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"digest": f"sha256:{layer * 64}", "size": 1, "mediaType": "x"},
        "layers": [],
    }
    digest: str = ecr.put_image(
        repositoryName="kokoro", imageManifest=orjson.dumps(manifest).decode(), imageTag=tag
    )["image"]["imageId"]["imageDigest"]
    return digest


def test_a_re_pushed_tag_is_a_new_model(
    moto_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ecr = boto3.client("ecr")
    uri = ecr.create_repository(repositoryName="kokoro")["repository"]["repositoryUri"]
    role = execution_role()
    argv = ["sagemaker", "--name", "kokoro-tts", "--image-uri", f"{uri}:1.0", "--role-arn", role]
    argv += ["--model-data", "s3://bucket/m.tar.gz", "--no-wait"]
    sm, _, _ = clients()
    images = []
    for layer in ("a", "b"):
        digest = _push(ecr, "1.0", layer)
        main(argv)
        assert f"image: {uri}@{digest}" in capsys.readouterr().out
        endpoint = sm.describe_endpoint(EndpointName="kokoro-tts")
        config = sm.describe_endpoint_config(EndpointConfigName=endpoint["EndpointConfigName"])
        model = sm.describe_model(ModelName=config["ProductionVariants"][0]["ModelName"])
        images.append(model["PrimaryContainer"]["Image"])
    assert images == [f"{uri}@{d}" for d in (_push(ecr, "a", "a"), _push(ecr, "b", "b"))]
    with pytest.raises(SystemExit):
        main([*argv[:4], f"{uri}:missing", *argv[5:]])
    assert "not in ECR (ImageNotFoundException)" in capsys.readouterr().err


# --- IAM, checked before anything is created -----------------------------------------------


def _role(trust: dict[str, Any]) -> dict[str, Any]:
    return {
        "Role": {
            "Path": "/",
            "RoleName": "SageMakerExecution",
            "RoleId": "AROAEXAMPLEEXAMPLE1",
            "Arn": ROLE,
            "CreateDate": NOW,
            "AssumeRolePolicyDocument": orjson.dumps(trust).decode(),
        }
    }


def _caller(calls: Calls, arn: str) -> None:
    identity = {"UserId": "AIDAEXAMPLE", "Account": "123456789012", "Arn": arn}
    calls.expect("sts", "get_caller_identity", identity)


def _decision(calls: Calls, caller: str, decision: str) -> None:
    result = {"EvalActionName": "iam:PassRole", "EvalResourceName": ROLE, "EvalDecision": decision}
    calls.expect(
        "iam",
        "simulate_principal_policy",
        {"EvaluationResults": [result]},
        PolicySourceArn=caller,
        ActionNames=["iam:PassRole"],
        ResourceArns=[ROLE],
        ContextEntries=[
            {
                "ContextKeyName": "iam:PassedToService",
                "ContextKeyValues": ["sagemaker.amazonaws.com"],
                "ContextKeyType": "string",
            }
        ],
    )


def _check(calls: Calls) -> list[str]:
    return check_role(ROLE, calls.clients["iam"], calls.clients["sts"])


def test_a_role_sagemaker_may_assume_and_the_caller_may_pass() -> None:
    calls = Calls()
    calls.expect("iam", "get_role", _role(TRUST), RoleName="SageMakerExecution")
    _caller(calls, "arn:aws:sts::123456789012:assumed-role/Deployer/ci-run")
    _decision(calls, "arn:aws:iam::123456789012:role/Deployer", "allowed")
    assert _check(calls) == []
    calls.done()


def test_roles_sagemaker_could_not_use_are_refused() -> None:
    calls = Calls()
    calls.refuse("iam", "get_role", "NoSuchEntity", "The role cannot be found.")
    with pytest.raises(DeployError, match="no such role"):
        _check(calls)
    lambda_only = orjson.loads(orjson.dumps(TRUST).replace(b"sagemaker", b"lambda"))
    calls.expect("iam", "get_role", _role(lambda_only))
    with pytest.raises(DeployError, match=r"does not let sagemaker\.amazonaws\.com assume it"):
        _check(calls)
    calls.expect("iam", "get_role", _role(TRUST))
    _caller(calls, "arn:aws:iam::123456789012:user/dev")
    _decision(calls, "arn:aws:iam::123456789012:user/dev", "implicitDeny")
    with pytest.raises(DeployError, match=r"may not pass .* \(iam:PassRole is implicitDeny\)"):
        _check(calls)
    calls.done()
    assert ("sagemaker", "CreateModel") not in calls.order


def test_checks_the_caller_may_not_make_are_reported_and_skipped() -> None:
    calls = Calls()
    calls.refuse("iam", "get_role", "AccessDenied", "not authorized to perform iam:GetRole")
    _caller(calls, "arn:aws:iam::123456789012:user/dev")
    calls.refuse("iam", "simulate_principal_policy", "AccessDenied", "not authorized")
    assert _check(calls) == [
        "the role was not checked (no iam:GetRole)",
        "iam:PassRole was not checked (AccessDenied)",
    ]


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


# --- hardening: Kubernetes -----------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
KUBECTL = Path(sys.executable).parent / "kubectl"
GATEWAY_PORT, INTERNAL_PORT, MODEL_PORT = 8000, 9101, 8080
KEYS_DIR, KEYS_SECRET, KEYS_ITEM = "/etc/gateway", "gateway-api-keys", "api-keys"
# variables naming a directory a library writes at run time; the root filesystems are read-only
CACHE_VARIABLES = {"XDG_CACHE_HOME", "HF_HOME", "CUDA_CACHE_PATH", "TORCH_HOME"}
IMAGES = {"gateway": "gateway.Dockerfile", "model-server": "model-server-{overlay}.Dockerfile"}
UNITS = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}


def _quantity(value: str | int | float) -> float:
    """A Kubernetes quantity: `500m` is 0.5, `1Gi` 2**30."""
    found = re.fullmatch(r"([0-9.]+)(m|k|M|G|Ki|Mi|Gi)?", str(value))
    assert found, value
    return float(found[1]) * UNITS.get(found[2] or "", 1.0)


def _size(value: str) -> int:
    """An nginx or compose size: `64k` is 65536, `3g` 3 * 2**30."""
    found = re.fullmatch(r"([0-9]+)([kmg]?)b?", value.lower())
    assert found, value
    return int(found[1]) << 10 * " kmg".index(found[2] or " ")


def _rendered(overlay: str) -> list[dict[str, Any]]:
    result = subprocess.run(
        [str(KUBECTL), "kustomize", str(ROOT / "k8s" / "overlays" / overlay)],
        capture_output=True,
        text=True,
        check=True,
    )
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module", params=["cpu", "gpu"])
def k8s(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, _rendered(request.param)


def _kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def _named(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in _kind(docs, kind) if d["metadata"]["name"] == name]
    return doc


def _pod(deployment: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return pod


def _labels(deployment: dict[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = deployment["spec"]["template"]["metadata"]["labels"]
    return labels


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", []), *pod["containers"]]


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert "matchExpressions" not in selector  # not used here: keep the check simple
    return bool(selector.get("matchLabels", {}).items() <= labels.items())


def _under(path: str, directories: set[str]) -> bool:
    return any(PurePosixPath(path).is_relative_to(d) for d in directories)


def _writable_mounts(pod: dict[str, Any], container: dict[str, Any]) -> set[str]:
    empty_dirs = {v["name"] for v in pod.get("volumes", []) if "emptyDir" in v}
    return {
        m["mountPath"]
        for m in container.get("volumeMounts", [])
        if m["name"] in empty_dirs and not m.get("readOnly", False)
    }


def test_only_the_gateway_reaches_the_model_server(k8s: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = k8s
    model = _labels(_named(docs, "Deployment", "model-server"))
    gateway = _labels(_named(docs, "Deployment", "gateway"))
    policies = _kind(docs, "NetworkPolicy")
    # policies add up: every one that selects the model server's pods may only let the gateway in
    guarding = [p for p in policies if _selects(p["spec"]["podSelector"], model)]
    assert guarding, "no NetworkPolicy selects the model server's pods"
    for policy in guarding:
        assert "Ingress" in policy["spec"]["policyTypes"]
        for rule in policy["spec"].get("ingress", []):
            assert rule.get("from"), f"{policy['metadata']['name']}: a rule open to any source"
            for peer in rule["from"]:
                assert set(peer) == {"podSelector"}, peer  # no namespaceSelector, no ipBlock
                assert _selects(peer["podSelector"], gateway)
                assert not _selects(peer["podSelector"], model)
            assert rule["ports"] == [{"protocol": "TCP", "port": MODEL_PORT}]
    (ports,) = [c["ports"] for c in _pod(_named(docs, "Deployment", "model-server"))["containers"]]
    assert [p["containerPort"] for p in ports] == [MODEL_PORT]


def test_the_gateway_policy_opens_the_public_port_and_keeps_metrics_in_the_cluster(
    k8s: tuple[str, list[dict[str, Any]]],
) -> None:
    _, docs = k8s
    gateway = _labels(_named(docs, "Deployment", "gateway"))
    (policy,) = [
        p for p in _kind(docs, "NetworkPolicy") if _selects(p["spec"]["podSelector"], gateway)
    ]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    sources = {
        port["port"]: rule.get("from")
        for rule in policy["spec"]["ingress"]
        for port in rule["ports"]
    }
    assert set(sources) == {GATEWAY_PORT, INTERNAL_PORT}
    assert (
        sources[GATEWAY_PORT] is None
    )  # from anywhere: the Ingress controller, in-cluster clients
    assert sources[INTERNAL_PORT] == [{"namespaceSelector": {}}]  # pods of the cluster, no ipBlock


def test_pods_mount_no_service_account_token(k8s: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = k8s
    deployments = _kind(docs, "Deployment")
    assert {d["metadata"]["name"] for d in deployments} == {"gateway", "model-server"}
    for deployment in deployments:
        assert _pod(deployment)["automountServiceAccountToken"] is False


def test_every_container_has_cpu_and_memory_requests_and_limits(
    k8s: tuple[str, list[dict[str, Any]]],
) -> None:
    overlay, docs = k8s
    for deployment in _kind(docs, "Deployment"):
        for container in _containers(_pod(deployment)):
            requests, limits = container["resources"]["requests"], container["resources"]["limits"]
            for resource in ("cpu", "memory"):
                assert 0 < _quantity(requests[resource]) <= _quantity(limits[resource]), (
                    f"{container['name']}: {resource}"
                )
    model = _pod(_named(docs, "Deployment", "model-server"))["containers"][0]
    resources = model["resources"]
    if overlay == "cpu":  # onnxruntime on cores: all it asks for, no more
        assert _quantity(resources["requests"]["cpu"]) == _quantity(resources["limits"]["cpu"]) >= 4
        assert "nvidia.com/gpu" not in resources["limits"]
    else:
        assert resources["limits"]["nvidia.com/gpu"] == 1
    # onnxruntime's threads follow the CPU limit, not the node's cores (which it would throttle)
    assert _env(model)["MODEL_SERVER_THREADS"] == {
        "resourceFieldRef": {"containerName": model["name"], "resource": "limits.cpu"}
    }


def test_every_empty_dir_has_a_size_limit(k8s: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = k8s
    empty_dirs = [
        (d["metadata"]["name"], v)
        for d in _kind(docs, "Deployment")
        for v in _pod(d).get("volumes", [])
        if "emptyDir" in v
    ]
    assert len(empty_dirs) >= 2
    for name, volume in empty_dirs:
        assert _quantity(volume["emptyDir"]["sizeLimit"]) > 0, f"{name}: {volume['name']}"


def test_containers_run_locked_down(k8s: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = k8s
    for deployment in _kind(docs, "Deployment"):
        pod = _pod(deployment)
        for container in _containers(pod):
            context = {**pod.get("securityContext", {}), **container.get("securityContext", {})}
            where = f"{deployment['metadata']['name']}/{container['name']}"
            assert context["runAsNonRoot"] is True, where
            # the model server's images run as root for SageMaker: the pod names the user
            assert context["runAsUser"] == 10001, where
            assert context["allowPrivilegeEscalation"] is False, where
            assert context["readOnlyRootFilesystem"] is True, where
            assert context["capabilities"] == {"drop": ["ALL"]}, where
            assert context["seccompProfile"] == {"type": "RuntimeDefault"}, where
            assert "privileged" not in context, where


def test_what_the_images_write_at_run_time_lands_on_a_writable_volume(
    k8s: tuple[str, list[dict[str, Any]]],
) -> None:
    """A read-only root filesystem: every cache directory the image or the manifest names is
    under an emptyDir mount (the GPU image's HF_HOME in the home directory is overridden)."""
    overlay, docs = k8s
    for name, dockerfile in IMAGES.items():
        pod = _pod(_named(docs, "Deployment", name))
        (container,) = pod["containers"]
        image_env = DockerfileParser(str(DOCKER / dockerfile.format(overlay=overlay))).envs
        env = {**image_env, **_env(container)}
        writable = _writable_mounts(pod, container)
        assert "/tmp" in writable, name  # tempfile's default directory
        for variable in CACHE_VARIABLES & env.keys():
            assert _under(env[variable], writable), f"{name}: {variable}={env[variable]}"


def test_the_ingress_limits_rates_connections_and_bodies(
    k8s: tuple[str, list[dict[str, Any]]],
) -> None:
    _, docs = k8s
    (ingress,) = _kind(docs, "Ingress")
    annotations = ingress["metadata"]["annotations"]
    prefix = "nginx.ingress.kubernetes.io/"
    assert int(annotations[prefix + "limit-rps"]) > 0
    assert int(annotations[prefix + "limit-connections"]) > 0
    body = _size(annotations[prefix + "proxy-body-size"])
    # no smaller than the gateway's own limit (its 413 is JSON), and not much larger
    assert GatewaySettings().max_body_bytes <= body <= 128 * 1024
    # still a streaming proxy: SSE unbuffered, WebSockets open for an hour
    assert annotations[prefix + "proxy-buffering"] == "off"
    assert int(annotations[prefix + "proxy-read-timeout"]) >= 3600
    assert int(annotations[prefix + "proxy-send-timeout"]) >= 3600


def test_the_gateway_reads_its_api_keys_from_the_operators_secret(
    k8s: tuple[str, list[dict[str, Any]]],
) -> None:
    _, docs = k8s
    pod = _pod(_named(docs, "Deployment", "gateway"))
    (container,) = pod["containers"]
    env = _env(container)
    assert env["GATEWAY_API_KEYS_FILE"] == f"{KEYS_DIR}/{KEYS_ITEM}"
    assert "GATEWAY_API_KEYS" not in env  # keys never in a manifest
    assert env.get("GATEWAY_ALLOW_ANONYMOUS", "false") == "false"
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == KEYS_DIR]
    assert mount["readOnly"] is True
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    secret = volume["secret"]
    assert secret["secretName"] == KEYS_SECRET
    assert secret["optional"] is False  # no Secret, no pod: never a gateway without keys
    assert secret.get("items", [{"key": KEYS_ITEM, "path": KEYS_ITEM}]) == [
        {"key": KEYS_ITEM, "path": KEYS_ITEM}
    ]
    # readable by the gateway's user (uid 10001) through its group, by nobody else
    assert secret["defaultMode"] & 0o007 == 0
    assert secret["defaultMode"] & 0o040
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]
    # the operator creates the Secret: none is committed
    assert not [s for s in _kind(docs, "Secret") if s["metadata"]["name"] == KEYS_SECRET]
    assert not list((ROOT / "k8s").rglob("api-keys*"))


def test_the_gateway_serves_metrics_on_an_internal_port_that_no_service_routes(
    k8s: tuple[str, list[dict[str, Any]]],
) -> None:
    _, docs = k8s
    deployment = _named(docs, "Deployment", "gateway")
    (container,) = _pod(deployment)["containers"]
    env = _env(container)
    assert env["GATEWAY_INTERNAL_HOST"] == "0.0.0.0"
    assert env["GATEWAY_INTERNAL_PORT"] == str(INTERNAL_PORT)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": GATEWAY_PORT, "metrics": INTERNAL_PORT}
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(INTERNAL_PORT)
    assert annotations["prometheus.io/path"] == "/metrics"
    # probes stay on the public port, where /healthz and a detail-free /readyz still answer
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    # no Service in front of the gateway's pods carries the internal port
    for service in _kind(docs, "Service"):
        if _selects({"matchLabels": service["spec"]["selector"]}, _labels(deployment)):
            for port in service["spec"]["ports"]:
                assert port["targetPort"] in {"http", GATEWAY_PORT}, service["metadata"]["name"]


def test_the_gateway_accepts_the_ingress_host_and_its_probes(
    k8s: tuple[str, list[dict[str, Any]]],
) -> None:
    _, docs = k8s
    (container,) = _pod(_named(docs, "Deployment", "gateway"))["containers"]
    env = _env(container)
    allowed = set(env["GATEWAY_ALLOWED_HOSTS"].split(","))
    (ingress,) = _kind(docs, "Ingress")
    hosts = {rule["host"] for rule in ingress["spec"]["rules"]}
    assert hosts <= allowed
    # the kubelet's probes and Prometheus send the pod's address as the Host
    assert "$(POD_IP)" in allowed
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    names = [e["name"] for e in container["env"]]
    assert names.index("POD_IP") < names.index("GATEWAY_ALLOWED_HOSTS")  # $(VAR) looks back


def test_the_manifests_set_only_settings_the_services_have(
    k8s: tuple[str, list[dict[str, Any]]],
) -> None:
    _, docs = k8s
    known = {
        "gateway": ("GATEWAY_", GatewaySettings),
        "model-server": ("MODEL_SERVER_", ModelServerSettings),
    }
    for name, (prefix, settings) in known.items():
        fields = {f.name for f in dataclasses.fields(settings)}
        (container,) = _pod(_named(docs, "Deployment", name))["containers"]
        for variable in _env(container):
            if variable.startswith(prefix):
                assert variable.removeprefix(prefix).lower() in fields, f"{name}: {variable}"


# --- hardening: compose --------------------------------------------------------------------

COMPOSE = {"cpu": ["compose.yaml"], "gpu": ["compose.yaml", "compose.gpu.yaml"]}
INTERPOLATION = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def _compose_merge(base: Any, override: Any) -> Any:
    """Compose's merge of mappings; sequences of the override replace (compose concatenates a few,
    such as ports: test_compose_publishes_only_the_gateway_on_loopback reads each file too)."""
    if isinstance(base, dict) and isinstance(override, dict):
        return {k: _compose_merge(base[k], v) if k in base else v for k, v in override.items()} | {
            k: v for k, v in base.items() if k not in override
        }
    return override


@pytest.fixture(params=sorted(COMPOSE))
def compose(request: pytest.FixtureRequest) -> dict[str, dict[str, Any]]:
    merged: dict[str, Any] = {}
    for name in COMPOSE[request.param]:
        merged = _compose_merge(merged, yaml.safe_load((DOCKER / name).read_text()))
    services: dict[str, dict[str, Any]] = merged["services"]
    return services


def _defaulted(value: Any) -> str:
    """`${VAR:-default}` as compose runs it with VAR unset."""
    return INTERPOLATION.sub(lambda m: m.group(2) or "", str(value))


def _compose_env(service: dict[str, Any]) -> dict[str, str | None]:
    """A service's environment, list or mapping form; None: passed through from the shell."""
    environment = service.get("environment", {})
    if isinstance(environment, dict):
        return {k: None if v is None else str(v) for k, v in environment.items()}
    pairs = [item.split("=", 1) for item in environment]
    return {pair[0]: pair[1] if len(pair) == 2 else None for pair in pairs}


def test_compose_publishes_only_the_gateway_on_loopback(
    compose: dict[str, dict[str, Any]],
) -> None:
    for name in COMPOSE["gpu"]:
        model = yaml.safe_load((DOCKER / name).read_text())["services"]["model-server"]
        assert "ports" not in model, name  # reached on the compose network only
    assert compose["model-server"].get("expose", [str(MODEL_PORT)]) == [str(MODEL_PORT)]
    (port,) = compose["gateway"]["ports"]
    assert port == "127.0.0.1:${PORT:-8000}:8000"
    assert _defaulted(port).split(":") == ["127.0.0.1", "8000", "8000"]
    assert _compose_env(compose["gateway"])["GATEWAY_MODEL_SERVER_URL"] == (
        f"http://model-server:{MODEL_PORT}"
    )


def test_compose_serves_anonymously_only_because_it_publishes_on_loopback(
    compose: dict[str, dict[str, Any]],
) -> None:
    env = _compose_env(compose["gateway"])
    assert _defaulted(env["GATEWAY_ALLOW_ANONYMOUS"]) == "true"
    # keys pass through from the shell, for a gateway published anywhere else
    assert env["GATEWAY_API_KEYS"] is None
    assert env["GATEWAY_API_KEYS_FILE"] is None
    # it listens on 0.0.0.0 in the container: loopback Host names guard against DNS rebinding
    assert set(_defaulted(env["GATEWAY_ALLOWED_HOSTS"]).split(",")) == {"localhost", "127.0.0.1"}
    text = (DOCKER / "compose.yaml").read_text()
    comment = text[: text.index("GATEWAY_ALLOW_ANONYMOUS=")].rsplit("GATEWAY_MODEL_SERVER_URL", 1)
    assert "loopback" in comment[1]
    assert "GATEWAY_API_KEYS" in comment[1]
    fields = {f.name for f in dataclasses.fields(GatewaySettings)}
    for variable in env:
        if variable.startswith("GATEWAY_"):
            assert variable.removeprefix("GATEWAY_").lower() in fields, variable


def test_compose_services_run_locked_down(compose: dict[str, dict[str, Any]]) -> None:
    # the model server's images run as root for SageMaker: compose names the user
    assert compose["model-server"]["user"] == "10001:10001"
    for name, service in compose.items():
        assert service["read_only"] is True, name
        assert service["cap_drop"] == ["ALL"], name
        assert "no-new-privileges:true" in service["security_opt"], name
        assert not service.get("privileged", False), name
        limits = service["deploy"]["resources"]["limits"]
        assert float(_defaulted(limits["cpus"])) > 0, name
        # the fleet's Redis holds counters (nothing saved); the services at least a GiB
        least = 64 * 2**20 if name == "redis" else 2**30
        assert _size(_defaulted(limits["memory"])) >= least, name


def test_compose_gives_what_is_written_at_run_time_a_tmpfs(
    compose: dict[str, dict[str, Any]],
) -> None:
    images = {"gateway": "gateway.Dockerfile", "gateway-2": "gateway.Dockerfile"} | {
        "model-server": str(compose["model-server"]["build"]["dockerfile"]).removeprefix("docker/")
    }
    # Redis (the fleet profile's, a registry image) writes only to /data
    redis = {entry.split(":", 1)[0]: entry for entry in compose["redis"]["tmpfs"]}
    assert "size=" in redis["/data"]
    assert compose["redis"]["command"][1:5] == ["--save", "", "--appendonly", "no"]
    for name, service in compose.items():
        if name == "redis":
            continue
        tmpfs = {entry.split(":", 1)[0]: entry for entry in service["tmpfs"]}
        assert "/tmp" in tmpfs, name
        for entry in tmpfs.values():
            assert "size=" in entry, f"{name}: {entry}: unbounded"  # it counts as memory
        image_env = DockerfileParser(str(DOCKER / images[name])).envs
        env = {**image_env, **{k: v for k, v in _compose_env(service).items() if v is not None}}
        for variable in CACHE_VARIABLES & env.keys():
            assert _under(env[variable], set(tmpfs)), f"{name}: {variable}={env[variable]}"


def test_compose_health_checks_use_the_public_ports(compose: dict[str, dict[str, Any]]) -> None:
    gateway = " ".join(compose["gateway"]["healthcheck"]["test"])
    assert f"http://127.0.0.1:{GATEWAY_PORT}/readyz" in gateway  # answers there without details
    model = " ".join(compose["model-server"]["healthcheck"]["test"])
    assert f"http://127.0.0.1:{MODEL_PORT}/ping" in model


def test_the_deployment_guide_says_how_to_create_the_keys_secret() -> None:
    guide = (ROOT / "docs" / "deployment.md").read_text()
    assert f"kubectl create secret generic {KEYS_SECRET} --from-file={KEYS_ITEM}=" in guide
    assert str(INTERNAL_PORT) in guide
    assert "127.0.0.1:" in guide
    links = re.findall(r"\]\(([^)]+)\)", guide)
    assert links
    assert not [link for link in links if re.match(r"[a-z]+:", link)]  # no links outside


def test_the_deployment_guide_lists_the_minimal_policies() -> None:
    guide = (ROOT / "docs" / "deployment.md").read_text()
    iam = guide.split("### IAM", 1)[1].split("\n## ", 1)[0]
    policies = [orjson.loads(block) for block in re.findall(r"```json\n(.*?)```", iam, re.S)]
    trust, role, caller = policies
    assert trust["Statement"][0]["Principal"] == {"Service": "sagemaker.amazonaws.com"}

    def actions(policy: dict[str, Any]) -> set[str]:
        found: set[str] = set()
        for statement in policy["Statement"]:
            action = statement["Action"]
            found |= {action} if isinstance(action, str) else set(action)
        return found

    assert {"ecr:BatchGetImage", "s3:GetObject", "logs:PutLogEvents"} <= actions(role)
    assert "cloudwatch:PutMetricData" in actions(role)
    # every call kokoro-deploy makes (as the Stubber tests record them) is allowed
    made = {
        "sagemaker": {op for _, op in UPDATE_START + UPDATE_END if _ == "sagemaker"},
        "application-autoscaling": {"DeregisterScalableTarget", "DescribeScalableTargets"},
        "cloudwatch": {"PutMetricAlarm", "DescribeAlarms", "DeleteAlarms"},
        "iam": {"PassRole", "GetRole", "SimulatePrincipalPolicy"},
        "ecr": {"DescribeImages"},
    }
    for service, operations in made.items():
        for operation in operations:
            assert f"{service}:{operation}" in actions(caller), operation
    assert "AWSServiceRoleForApplicationAutoScaling_SageMakerEndpoint" in iam
