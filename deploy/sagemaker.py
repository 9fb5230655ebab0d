"""Create or update a SageMaker real-time endpoint for the Kokoro model server, idempotently.

SageMaker models and endpoint configs are immutable, so their names carry a digest of what
defines them: re-running with the same arguments reuses them, changed arguments create new ones
and the endpoint is updated in place (no downtime). Autoscaling is target tracking on
invocations per instance.
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
    try:
        call(**kwargs)
    except ClientError as exc:
        if exc.response["Error"]["Code"] in ("ValidationException", "ResourceNotFound"):
            return False
        raise
    return True


def deploy(
    spec: EndpointSpec, sagemaker: Any, autoscaling: Any, wait: bool = True
) -> dict[str, Any]:
    """Returns what was done, for the CLI to print."""
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
            ModelName=spec.model_name, PrimaryContainer=container, ExecutionRoleArn=spec.role_arn
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
            EndpointConfigName=spec.config_name, ProductionVariants=[variant]
        )
        done["config_action"] = "created"
    try:
        current = sagemaker.describe_endpoint(EndpointName=spec.name)
    except ClientError as exc:
        if exc.response["Error"]["Code"] != "ValidationException":
            raise
        current = None
    if current is None:
        sagemaker.create_endpoint(EndpointName=spec.name, EndpointConfigName=spec.config_name)
        done["endpoint_action"] = "created"
    elif current["EndpointConfigName"] != spec.config_name:
        sagemaker.update_endpoint(EndpointName=spec.name, EndpointConfigName=spec.config_name)
        done["endpoint_action"] = "updated"
    else:
        done["endpoint_action"] = "unchanged"
    if wait:
        sagemaker.get_waiter("endpoint_in_service").wait(
            EndpointName=spec.name, WaiterConfig={"Delay": 30, "MaxAttempts": 60}
        )
    done["status"] = sagemaker.describe_endpoint(EndpointName=spec.name)["EndpointStatus"]
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
    done["autoscaling"] = f"{spec.min_instances}-{spec.max_instances} instances"
    return done


def teardown(name: str, sagemaker: Any, autoscaling: Any) -> list[str]:
    """Remove the endpoint, its configs and models, and its autoscaling. Safe to re-run."""
    removed: list[str] = []
    resource_id = f"endpoint/{name}/variant/{VARIANT}"
    policies = autoscaling.describe_scaling_policies(
        ServiceNamespace="sagemaker", ResourceId=resource_id
    )["ScalingPolicies"]
    for policy in policies:
        autoscaling.delete_scaling_policy(
            PolicyName=policy["PolicyName"],
            ServiceNamespace="sagemaker",
            ResourceId=resource_id,
            ScalableDimension=SCALABLE_DIMENSION,
        )
        removed.append(f"scaling policy {policy['PolicyName']}")
    targets = autoscaling.describe_scalable_targets(
        ServiceNamespace="sagemaker", ResourceIds=[resource_id]
    )["ScalableTargets"]
    if targets:
        autoscaling.deregister_scalable_target(
            ServiceNamespace="sagemaker",
            ResourceId=resource_id,
            ScalableDimension=SCALABLE_DIMENSION,
        )
        removed.append(f"scalable target {resource_id}")
    if _exists(sagemaker.describe_endpoint, EndpointName=name):
        sagemaker.delete_endpoint(EndpointName=name)
        removed.append(f"endpoint {name}")
    configs = sagemaker.list_endpoint_configs(NameContains=name)["EndpointConfigs"]
    for config in configs:
        if config["EndpointConfigName"].startswith(f"{name}-"):
            sagemaker.delete_endpoint_config(EndpointConfigName=config["EndpointConfigName"])
            removed.append(f"endpoint config {config['EndpointConfigName']}")
    models = sagemaker.list_models(NameContains=name)["Models"]
    for model in models:
        if model["ModelName"].startswith(f"{name}-"):
            sagemaker.delete_model(ModelName=model["ModelName"])
            removed.append(f"model {model['ModelName']}")
    return removed
