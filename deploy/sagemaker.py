"""Create or update a SageMaker real-time endpoint for the Kokoro model server, idempotently.

SageMaker models and endpoint configs are immutable, so their names carry a digest of what
defines them (the image by digest, so a re-pushed tag is a new model): re-running with the same
arguments reuses them, changed arguments create new ones and the endpoint is updated in place
(no downtime): a blue/green deployment that rolls back on the endpoint's 5XX and latency alarms,
keeping the variant's live instance count. Autoscaling (target tracking on invocations and on
requests in flight) is deregistered around an update that changes the instance type, which AWS
refuses for an autoscaled variant, and registered again once the endpoint is in service. What
the command creates is tagged with the endpoint's name; teardown removes exactly that.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from typing import Any

import orjson
from botocore.exceptions import ClientError

log = logging.getLogger(__name__)

VARIANT = "AllTraffic"
# NVIDIA driver 550 (CUDA 12.4) instead of ml.g5's default 470: the GPU image's CUDA 13 torch
# runs on it through CUDA forward compatibility (model_server/cuda_compat.py).
GPU_AMI_VERSION = "al2-ami-sagemaker-inference-gpu-3-1"
SCALABLE_DIMENSION = "sagemaker:variant:DesiredInstanceCount"
# Each request goes to the instance with the fewest in flight, not a random one: a long bidi
# session on one instance must not attract new replies there.
ROUTING_STRATEGY = "LEAST_OUTSTANDING_REQUESTS"
# Concurrent requests (bidi sessions and streams in flight) follow real-time load; invocations
# per minute count a session that speaks for minutes as one.
CONCURRENCY_METRIC = "SageMakerVariantConcurrentRequestsPerModelHighResolution"
INVOCATIONS_METRIC = "SageMakerVariantInvocationsPerInstance"
TAG = "kokoro:endpoint"  # on each model and endpoint config: the endpoint it was made for
MAX_NAME = 63 - 11  # SageMaker's 63 characters, less "-" and the 10-character digest
PAGE_SIZE = 100  # SageMaker's largest page
BUSY = ("Creating", "Updating", "SystemUpdating", "RollingBack", "Deleting", "UpdateRollbackFailed")
DEPLOYMENTS = ("blue-green", "rolling")


class DeployError(Exception):
    """Something to fix before deploying, said plainly (the CLI prints it, no traceback)."""


@dataclass(frozen=True)
class EndpointSpec:
    name: str
    image_uri: str
    model_data_url: str | None  # s3://.../model.tar.gz: weights and voice packs -> /opt/ml/model
    role_arn: str
    instance_type: str = "ml.g5.xlarge"
    initial_instance_count: int = 1
    min_instances: int = 1
    max_instances: int = 4
    target_invocations_per_instance: float = 20.0
    target_concurrency_per_instance: float = 8.0
    environment: dict[str, str] = field(default_factory=dict)
    inference_ami_version: str | None = None
    deployment: str = "blue-green"  # or "rolling": how an update replaces the fleet
    latency_alarm_ms: float = 5000.0  # p90 ModelLatency that rolls an update back

    def _digest(self, *parts: object) -> str:
        return hashlib.sha256(orjson.dumps(parts, option=orjson.OPT_SORT_KEYS)).hexdigest()[:10]

    @property
    def model_name(self) -> str:
        digest = self._digest(self.image_uri, self.model_data_url, self.role_arn, self.environment)
        return f"{self.name}-{digest}"

    @property
    def config_name(self) -> str:
        digest = self._digest(
            self.model_name,
            self.instance_type,
            self.initial_instance_count,
            self.inference_ami_version,
            ROUTING_STRATEGY,
        )
        return f"{self.name}-{digest}"

    @property
    def resource_id(self) -> str:
        return f"endpoint/{self.name}/variant/{VARIANT}"


def default_ami_version(instance_type: str) -> str | None:
    """GPU instance families get the newer-driver AMI; others keep SageMaker's default."""
    family = instance_type.removeprefix("ml.").split(".")[0]
    return GPU_AMI_VERSION if family[:1] in ("g", "p") else None


def _exists(call: Any, **kwargs: Any) -> bool:
    """Whether a SageMaker resource exists: only "Could not find" means it does not."""
    try:
        call(**kwargs)
    except ClientError as exc:
        if _not_found(exc):
            return False
        raise
    return True


def _not_found(exc: ClientError) -> bool:
    error = exc.response.get("Error", {})
    code, message = error.get("Code", ""), error.get("Message", "")
    return code == "ResourceNotFound" or (
        code in ("ValidationException", "ValidationError") and "Could not find" in message
    )


def _tags(spec: EndpointSpec) -> list[dict[str, str]]:
    return [{"Key": TAG, "Value": spec.name}]


def check_spec(spec: EndpointSpec) -> None:
    """What can be refused before any call."""
    if len(spec.name) > MAX_NAME:
        raise DeployError(
            f"--name {spec.name!r} has {len(spec.name)} characters; at most {MAX_NAME} "
            "(model and config names add an 11-character digest to SageMaker's 63)"
        )
    torch = spec.environment.get("MODEL_SERVER_ENGINE", "torch") == "torch"
    if torch and default_ami_version(spec.instance_type) and not spec.model_data_url:
        raise DeployError(
            "the GPU image loads its weights from /opt/ml/model: pass --model-data "
            "s3://.../model.tar.gz (kokoro-deploy model-data makes one), or "
            "--env MODEL_SERVER_ENGINE=onnx for the CPU image"
        )
    if spec.deployment not in DEPLOYMENTS:
        raise DeployError(f"--deployment must be one of {', '.join(DEPLOYMENTS)}")


def _current_endpoint(sagemaker: Any, name: str) -> dict[str, Any] | None:
    """The endpoint as it is now, or None; refuses the states an update cannot start from."""
    try:
        current: dict[str, Any] = sagemaker.describe_endpoint(EndpointName=name)
    except ClientError as exc:
        if _not_found(exc):
            return None
        raise
    status = current["EndpointStatus"]
    if status in BUSY:
        raise DeployError(
            f"endpoint {name!r} is {status}: wait until it is InService "
            f"(aws sagemaker wait endpoint-in-service --endpoint-name {name}), then re-run"
        )
    if status == "Failed":
        reason = current.get("FailureReason", "no reason given")
        raise DeployError(
            f"endpoint {name!r} is Failed ({reason}): SageMaker cannot update it; "
            f"remove it with `kokoro-deploy teardown --name {name}`, then deploy again"
        )
    return current


def _alarms(spec: EndpointSpec, cloudwatch: Any) -> list[str]:
    """The alarms that roll an update back: any 5XX, and p90 model latency over the limit."""
    dimensions = [
        {"Name": "EndpointName", "Value": spec.name},
        {"Name": "VariantName", "Value": VARIANT},
    ]
    common = {
        "Namespace": "AWS/SageMaker",
        "Dimensions": dimensions,
        "Period": 60,
        "ComparisonOperator": "GreaterThanOrEqualToThreshold",
        "TreatMissingData": "notBreaching",
    }
    errors, latency = f"{spec.name}-5xx", f"{spec.name}-latency"
    cloudwatch.put_metric_alarm(
        AlarmName=errors,
        AlarmDescription=f"{spec.name}: model containers answer 5XX",
        MetricName="Invocation5XXErrors",
        Statistic="Sum",
        Threshold=1.0,
        EvaluationPeriods=2,
        DatapointsToAlarm=2,
        **common,
    )
    cloudwatch.put_metric_alarm(
        AlarmName=latency,
        AlarmDescription=f"{spec.name}: p90 model latency over {spec.latency_alarm_ms:.0f} ms",
        MetricName="ModelLatency",  # microseconds
        ExtendedStatistic="p90",
        Threshold=spec.latency_alarm_ms * 1000,
        EvaluationPeriods=3,
        DatapointsToAlarm=3,
        **common,
    )
    return [errors, latency]


def _deployment_config(spec: EndpointSpec, alarms: list[str]) -> dict[str, Any]:
    """Blue/green with a canary (or rolling batches), baked 5 minutes, rolled back on alarms."""
    bake_s = 300
    policy: dict[str, Any]
    if spec.deployment == "rolling":
        policy = {
            "RollingUpdatePolicy": {
                "MaximumBatchSize": {"Type": "CAPACITY_PERCENT", "Value": 25},
                "WaitIntervalInSeconds": bake_s,
            }
        }
    else:
        policy = {
            "BlueGreenUpdatePolicy": {
                "TrafficRoutingConfiguration": {
                    "Type": "CANARY",
                    "CanarySize": {"Type": "CAPACITY_PERCENT", "Value": 25},
                    "WaitIntervalInSeconds": bake_s,
                },
                "TerminationWaitInSeconds": bake_s,
            }
        }
    return {**policy, "AutoRollbackConfiguration": {"Alarms": [{"AlarmName": a} for a in alarms]}}


def _scaling_registered(autoscaling: Any, spec: EndpointSpec) -> bool:
    targets = autoscaling.describe_scalable_targets(
        ServiceNamespace="sagemaker",
        ResourceIds=[spec.resource_id],
        ScalableDimension=SCALABLE_DIMENSION,
    )["ScalableTargets"]
    return bool(targets)


def _deregister_scaling(autoscaling: Any, resource_id: str) -> None:
    """Deregistering a target deletes its scaling policies with it."""
    autoscaling.deregister_scalable_target(
        ServiceNamespace="sagemaker", ResourceId=resource_id, ScalableDimension=SCALABLE_DIMENSION
    )


def _register_scaling(spec: EndpointSpec, autoscaling: Any) -> None:
    autoscaling.register_scalable_target(
        ServiceNamespace="sagemaker",
        ResourceId=spec.resource_id,
        ScalableDimension=SCALABLE_DIMENSION,
        MinCapacity=spec.min_instances,
        MaxCapacity=spec.max_instances,
    )
    # invocations per minute, and requests in flight (a bidi session speaking for minutes is
    # one invocation): whichever asks for more instances wins
    for suffix, metric, target, scale_out_s in (
        ("invocations", INVOCATIONS_METRIC, spec.target_invocations_per_instance, 60),
        ("concurrency", CONCURRENCY_METRIC, spec.target_concurrency_per_instance, 30),
    ):
        autoscaling.put_scaling_policy(
            PolicyName=f"{spec.name}-{suffix}",
            ServiceNamespace="sagemaker",
            ResourceId=spec.resource_id,
            ScalableDimension=SCALABLE_DIMENSION,
            PolicyType="TargetTrackingScaling",
            TargetTrackingScalingPolicyConfiguration={
                "TargetValue": target,
                "PredefinedMetricSpecification": {"PredefinedMetricType": metric},
                "ScaleInCooldown": 300,
                "ScaleOutCooldown": scale_out_s,
            },
        )


def deploy(
    spec: EndpointSpec, sagemaker: Any, autoscaling: Any, cloudwatch: Any, wait: bool = True
) -> dict[str, Any]:
    """Returns what was done, for the CLI to print. Refuses (`DeployError`) before creating
    anything when the spec or the endpoint's state does not allow it."""
    check_spec(spec)
    current = _current_endpoint(sagemaker, spec.name)
    done: dict[str, Any] = {
        "endpoint": spec.name,
        "model": spec.model_name,
        "config": spec.config_name,
    }
    if _exists(sagemaker.describe_model, ModelName=spec.model_name):
        done["model_action"] = "reused"
    else:
        container: dict[str, Any] = {"Image": spec.image_uri, "Environment": spec.environment}
        if spec.model_data_url:
            container["ModelDataUrl"] = spec.model_data_url
        sagemaker.create_model(
            ModelName=spec.model_name,
            PrimaryContainer=container,
            ExecutionRoleArn=spec.role_arn,
            Tags=_tags(spec),
        )
        done["model_action"] = "created"
    if _exists(sagemaker.describe_endpoint_config, EndpointConfigName=spec.config_name):
        done["config_action"] = "reused"
    else:
        variant: dict[str, Any] = {
            "VariantName": VARIANT,
            "ModelName": spec.model_name,
            "InstanceType": spec.instance_type,
            "InitialInstanceCount": spec.initial_instance_count,
            "RoutingConfig": {"RoutingStrategy": ROUTING_STRATEGY},
        }
        if spec.inference_ami_version:
            variant["InferenceAmiVersion"] = spec.inference_ami_version
        sagemaker.create_endpoint_config(
            EndpointConfigName=spec.config_name, ProductionVariants=[variant], Tags=_tags(spec)
        )
        done["config_action"] = "created"
    rescale = True
    if current is None:
        deployment = _deployment_config(spec, _alarms(spec, cloudwatch))
        sagemaker.create_endpoint(
            EndpointName=spec.name,
            EndpointConfigName=spec.config_name,
            DeploymentConfig=deployment,
            Tags=_tags(spec),
        )
        done["endpoint_action"] = "created"
    elif current["EndpointConfigName"] != spec.config_name:
        deployment = _deployment_config(spec, _alarms(spec, cloudwatch))
        (live,) = sagemaker.describe_endpoint_config(
            EndpointConfigName=current["EndpointConfigName"]
        )["ProductionVariants"]
        # AWS refuses an instance-type change on an autoscaled variant
        if live["InstanceType"] != spec.instance_type and _scaling_registered(autoscaling, spec):
            _deregister_scaling(autoscaling, spec.resource_id)
            done["autoscaling_paused"] = "deregistered for the instance-type change"
        # keep the live instance count (autoscaling's) unless the count asked for changed
        update: dict[str, Any] = {"RetainAllVariantProperties": True}
        if live.get("InitialInstanceCount") != spec.initial_instance_count:
            update["ExcludeRetainedVariantProperties"] = [
                {"VariantPropertyType": "DesiredInstanceCount"}
            ]
        sagemaker.update_endpoint(
            EndpointName=spec.name,
            EndpointConfigName=spec.config_name,
            DeploymentConfig=deployment,
            **update,
        )
        done["endpoint_action"] = "updated"
    else:
        done["endpoint_action"] = "unchanged"
    if wait:
        sagemaker.get_waiter("endpoint_in_service").wait(
            EndpointName=spec.name, WaiterConfig={"Delay": 30, "MaxAttempts": 60}
        )
    else:
        rescale = "autoscaling_paused" not in done  # registering needs the update done
    done["status"] = sagemaker.describe_endpoint(EndpointName=spec.name)["EndpointStatus"]
    if rescale:
        _register_scaling(spec, autoscaling)
        done["autoscaling"] = f"{spec.min_instances}-{spec.max_instances} instances"
    else:
        done["autoscaling"] = "not registered: re-run once the endpoint is InService"
    return done


def _tagged(sagemaker: Any, arn: str, name: str) -> bool:
    for page in sagemaker.get_paginator("list_tags").paginate(ResourceArn=arn):
        if {"Key": TAG, "Value": name} in page["Tags"]:
            return True
    return False


def _pages(sagemaker: Any, operation: str, key: str, **kwargs: Any) -> list[dict[str, Any]]:
    paginator = sagemaker.get_paginator(operation)
    pages = paginator.paginate(PaginationConfig={"PageSize": PAGE_SIZE}, **kwargs)
    return [item for page in pages for item in page[key]]


def _in_use(sagemaker: Any, leaving: str) -> tuple[set[str], set[str]]:
    """The configs other endpoints use, and their models: never deleted."""
    configs: set[str] = set()
    for endpoint in _pages(sagemaker, "list_endpoints", "Endpoints"):
        if endpoint["EndpointName"] != leaving:
            described = sagemaker.describe_endpoint(EndpointName=endpoint["EndpointName"])
            configs.add(described["EndpointConfigName"])
    models = {
        variant["ModelName"]
        for config in configs
        for variant in sagemaker.describe_endpoint_config(EndpointConfigName=config)[
            "ProductionVariants"
        ]
    }
    return configs, models


def teardown(name: str, sagemaker: Any, autoscaling: Any, cloudwatch: Any) -> list[str]:
    """Remove the endpoint, the configs and models deploy tagged with its name, its alarms and
    its autoscaling. Safe to re-run; another endpoint's resources are never touched."""
    removed: list[str] = []
    resource_id = f"endpoint/{name}/variant/{VARIANT}"
    targets = autoscaling.describe_scalable_targets(
        ServiceNamespace="sagemaker", ResourceIds=[resource_id]
    )["ScalableTargets"]
    if targets:
        _deregister_scaling(autoscaling, resource_id)  # and its policies
        removed.append(f"scalable target {resource_id}")
    alarms = [f"{name}-5xx", f"{name}-latency"]
    found = cloudwatch.describe_alarms(AlarmNames=alarms)["MetricAlarms"]
    if found:
        cloudwatch.delete_alarms(AlarmNames=[a["AlarmName"] for a in found])
        removed += [f"alarm {a['AlarmName']}" for a in found]
    if _exists(sagemaker.describe_endpoint, EndpointName=name):
        sagemaker.delete_endpoint(EndpointName=name)
        removed.append(f"endpoint {name}")
    used_configs, used_models = _in_use(sagemaker, name)
    for config in _pages(sagemaker, "list_endpoint_configs", "EndpointConfigs", NameContains=name):
        config_name = config["EndpointConfigName"]
        if config_name not in used_configs and _tagged(
            sagemaker, config["EndpointConfigArn"], name
        ):
            sagemaker.delete_endpoint_config(EndpointConfigName=config_name)
            removed.append(f"endpoint config {config_name}")
    for model in _pages(sagemaker, "list_models", "Models", NameContains=name):
        model_name = model["ModelName"]
        if model_name not in used_models and _tagged(sagemaker, model["ModelArn"], name):
            sagemaker.delete_model(ModelName=model_name)
            removed.append(f"model {model_name}")
    return removed
