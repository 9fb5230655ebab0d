"""`kokoro-deploy model-data ...`, `kokoro-deploy sagemaker ...`, `kokoro-deploy teardown`,
`kokoro-deploy agentcore ...` and `kokoro-deploy agentcore-teardown`.

Region and credentials come from the AWS SDK's default chain (`--region` overrides);
`AWS_ENDPOINT_URL_<SERVICE>` (or `AWS_ENDPOINT_URL`) points a client elsewhere. The role and the
image are checked before anything is created (deploy/preflight.py). Exit status 1: refused, or
an AWS error; 2: AgentCore failed the runtime it was asked for.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import boto3
from botocore.exceptions import BotoCoreError, ClientError, WaiterError

from deploy import agentcore
from deploy.model_data import pack, upload
from deploy.preflight import AGENTCORE_PRINCIPAL, check_role, ecr_region, resolve_image
from deploy.sagemaker import (
    DEPLOYMENTS,
    GPU_AMI_VERSION,
    DeployError,
    EndpointSpec,
    check_spec,
    default_ami_version,
    deploy,
    teardown,
)
from model_server.errors import ModelUnavailable


def _env(pairs: Sequence[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"kokoro-deploy: --env expects KEY=VALUE, got {pair!r}")
        env[key] = value
    return env


def _ami(requested: str | None, instance_type: str) -> str | None:
    if requested is None:
        return default_ami_version(instance_type)
    return None if requested == "default" else requested


def _model_data(model_dir: Path, out: Path, s3_uri: str | None, region: str | None) -> None:
    try:
        names = pack(model_dir, out)
        print(f"packed {out}: {', '.join(names)}")
        if s3_uri:
            uri = upload(out, s3_uri, boto3.client("s3", region_name=region))
            print(f"uploaded: --model-data {uri}")
    except (ModelUnavailable, ValueError, OSError, ClientError, BotoCoreError) as exc:
        print(f"kokoro-deploy: {exc}", file=sys.stderr)
        raise SystemExit(1) from exc


def _agentcore_parsers(sub: Any) -> None:
    up = sub.add_parser(
        "agentcore", help="create or update a Bedrock AgentCore runtime running the gateway"
    )
    up.add_argument("--name", required=True, help="runtime name (letters, digits, underscores)")
    up.add_argument(
        "--image-uri", required=True, help="the gateway's AgentCore image (arm64) in ECR"
    )
    up.add_argument("--role-arn", required=True, help="the runtime's execution role")
    speech = up.add_mutually_exclusive_group(required=True)
    speech.add_argument("--sagemaker-endpoint", help="speech from this SageMaker endpoint")
    speech.add_argument("--model-server-url", help="speech from these model servers")
    up.add_argument("--llm", choices=("bedrock", "openai", "echo"), default="bedrock")
    up.add_argument("--bedrock-model-id", help="the gateway's GATEWAY_BEDROCK_MODEL_ID")
    up.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="more of the gateway's settings, e.g. GATEWAY_DEFAULT_VOICE=af_bella",
    )
    up.add_argument("--endpoint", help="a named endpoint to point at the new version")
    up.add_argument(
        "--jwt-discovery-url", help="callers present a JWT from this OpenID issuer, not SigV4"
    )
    up.add_argument("--jwt-audience", action="append", default=[], help="(repeatable)")
    up.add_argument("--jwt-client", action="append", default=[], help="(repeatable)")
    up.add_argument("--no-wait", action="store_true", help="do not wait until READY")
    down = sub.add_parser("agentcore-teardown", help="remove the runtime and its endpoints")
    down.add_argument("--name", required=True)


def _agentcore(args: argparse.Namespace) -> None:
    control = boto3.client("bedrock-agentcore-control", region_name=args.region)
    try:
        if args.command == "agentcore-teardown":
            removed = agentcore.teardown(args.name, control)
            print("\n".join(f"removed {r}" for r in removed) or "nothing to remove")
            return
        region = control.meta.region_name
        spec = agentcore.RuntimeSpec(
            name=args.name,
            image_uri=args.image_uri,
            role_arn=args.role_arn,
            environment=agentcore.gateway_environment(
                region=region,
                sagemaker_endpoint=args.sagemaker_endpoint,
                model_server_url=args.model_server_url,
                llm=args.llm,
                bedrock_model_id=args.bedrock_model_id,
                extra=_env(args.env),
            ),
            endpoint=args.endpoint,
            jwt_discovery_url=args.jwt_discovery_url,
            jwt_audiences=tuple(args.jwt_audience),
            jwt_clients=tuple(args.jwt_client),
        )
        agentcore.check_spec(spec)
        notes = check_role(
            spec.role_arn, boto3.client("iam"), boto3.client("sts"), AGENTCORE_PRINCIPAL
        )
        ecr = boto3.client("ecr", region_name=ecr_region(spec.image_uri) or region)
        image, _ = resolve_image(spec.image_uri, ecr)  # an ECR image: check_spec said so
        spec = dataclasses.replace(spec, image_uri=image)
        for line in notes:
            print(f"note: {line}", file=sys.stderr)
        print(f"image: {image}")
        done = agentcore.deploy(spec, control, wait=not args.no_wait)
        for key, value in done.items():
            print(f"{key}: {value}")
        print(agentcore.how_to_invoke(done["runtime_arn"], done["qualifier"], region))
    except agentcore.DeployFailed as exc:
        print(f"kokoro-deploy: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    except (DeployError, ClientError, BotoCoreError) as exc:
        print(f"kokoro-deploy: {exc}", file=sys.stderr)
        raise SystemExit(1) from exc


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="kokoro-deploy", description=__doc__)
    parser.add_argument("--region", help="AWS region (default: the SDK's chain)")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("sagemaker", help="create or update the endpoint, then autoscaling")
    up.add_argument("--name", required=True, help="endpoint name")
    up.add_argument("--image-uri", required=True, help="the model server image in ECR")
    up.add_argument("--model-data", help="s3://.../model.tar.gz with weights and voice packs")
    up.add_argument("--role-arn", required=True, help="SageMaker execution role")
    up.add_argument("--instance-type", default="ml.g5.xlarge")
    up.add_argument("--initial-count", type=int, default=1)
    up.add_argument("--min-instances", type=int, default=1)
    up.add_argument("--max-instances", type=int, default=4)
    up.add_argument(
        "--target-invocations",
        type=float,
        default=20.0,
        help="target-tracking value: invocations per instance per minute",
    )
    up.add_argument(
        "--target-concurrency",
        type=float,
        default=8.0,
        help="target-tracking value: requests in flight per instance (real-time load)",
    )
    up.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="container environment, e.g. MODEL_SERVER_ENGINE=torch",
    )
    up.add_argument(
        "--inference-ami-version",
        help="the endpoint's AMI (NVIDIA driver); default for GPU instances: "
        f"{GPU_AMI_VERSION}; 'default' keeps SageMaker's",
    )
    up.add_argument(
        "--deployment",
        choices=DEPLOYMENTS,
        default="blue-green",
        help="how an update replaces the fleet (both roll back on the endpoint's alarms)",
    )
    up.add_argument(
        "--latency-alarm-ms",
        type=float,
        default=5000.0,
        help="p90 model latency that rolls an update back",
    )
    up.add_argument("--no-wait", action="store_true", help="do not wait for InService")
    data = sub.add_parser(
        "model-data", help="pack a Kokoro checkpoint directory as model.tar.gz (and upload it)"
    )
    data.add_argument("--model-dir", type=Path, required=True, help="config.json, .pth, voices/")
    data.add_argument("--out", type=Path, default=Path("model.tar.gz"))
    data.add_argument("--upload", metavar="S3_URI", help="s3://bucket/key to upload it to")
    down = sub.add_parser("teardown", help="remove the endpoint and everything it created")
    down.add_argument("--name", required=True)
    _agentcore_parsers(sub)
    args = parser.parse_args(argv)

    if args.command == "model-data":
        _model_data(args.model_dir, args.out, args.upload, args.region)
        return
    if args.command.startswith("agentcore"):
        _agentcore(args)
        return
    sagemaker = boto3.client("sagemaker", region_name=args.region)
    autoscaling = boto3.client("application-autoscaling", region_name=args.region)
    cloudwatch = boto3.client("cloudwatch", region_name=args.region)
    try:
        if args.command == "sagemaker":
            spec = EndpointSpec(
                name=args.name,
                image_uri=args.image_uri,
                model_data_url=args.model_data,
                role_arn=args.role_arn,
                instance_type=args.instance_type,
                initial_instance_count=args.initial_count,
                min_instances=args.min_instances,
                max_instances=args.max_instances,
                target_invocations_per_instance=args.target_invocations,
                target_concurrency_per_instance=args.target_concurrency,
                environment=_env(args.env),
                inference_ami_version=_ami(args.inference_ami_version, args.instance_type),
                deployment=args.deployment,
                latency_alarm_ms=args.latency_alarm_ms,
            )
            check_spec(spec)
            notes = check_role(spec.role_arn, boto3.client("iam"), boto3.client("sts"))
            ecr = boto3.client("ecr", region_name=ecr_region(spec.image_uri) or args.region)
            image, note = resolve_image(spec.image_uri, ecr)
            spec = dataclasses.replace(spec, image_uri=image)
            for line in [*notes, *([note] if note else [])]:
                print(f"note: {line}", file=sys.stderr)
            print(f"image: {image}")
            done = deploy(spec, sagemaker, autoscaling, cloudwatch, wait=not args.no_wait)
            for key, value in done.items():
                print(f"{key}: {value}")
        else:
            removed = teardown(args.name, sagemaker, autoscaling, cloudwatch)
            print("\n".join(f"removed {r}" for r in removed) or "nothing to remove")
    except (DeployError, ClientError, BotoCoreError, WaiterError) as exc:
        print(f"kokoro-deploy: {exc}", file=sys.stderr)
        raise SystemExit(1) from exc
