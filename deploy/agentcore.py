"""Create or update a Bedrock AgentCore runtime that runs the gateway image, idempotently.

A runtime is found by its name and is this command's only when it carries the tag
`kokoro:runtime=NAME`; anything else of that name is refused, never updated or deleted. The
container is the image by its ECR digest, network mode PUBLIC, protocol HTTP (the runtime then
calls POST /invocations, GET /ping and GET /ws on port 8080), the gateway's settings in its
environment. Re-running with the same arguments changes nothing; changed arguments make a new
runtime version (UpdateAgentRuntime), which the DEFAULT endpoint follows, and a named endpoint
(`--endpoint`) is pointed at it. Waiting is GetAgentRuntime polled until READY; a version that
fails is one `DeployFailed`, naming where its logs are. Teardown removes the runtime and its
named endpoints.
"""

from __future__ import annotations

import contextlib
import io
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import ClientError

from deploy.preflight import ecr_region
from deploy.sagemaker import DeployError
from gateway.config import ENV_PREFIX, Settings, parse_settings

TAG = "kokoro:runtime"  # on the runtime and its endpoints: the runtime name they belong to
NAME = re.compile(r"^[a-zA-Z][a-zA-Z0-9_]{0,47}$")  # AgentCore's rule for runtimes and endpoints
DEFAULT_ENDPOINT = "DEFAULT"  # made by AgentCore, following the latest version
PORT = 8080  # where AgentCore Runtime calls the container (docker/gateway-agentcore.Dockerfile)
DESCRIPTION = "kokoro voice gateway (kokoro-deploy agentcore)"
BUSY = ("CREATING", "UPDATING", "DELETING")
FAILED = ("CREATE_FAILED", "UPDATE_FAILED")
PAGE_SIZE = 100
# AgentCore authenticates every call before the container sees it (SigV4 for
# bedrock-agentcore:InvokeAgentRuntime, or the runtime's JWT authorizer), and the caller's
# Authorization header is that signature or that token: the gateway's own keys cannot travel.
# Its refusal to serve anonymously beyond loopback is turned off here, out loud, where
# GetAgentRuntime shows it; the image itself keeps the refusal (docs/deployment.md). The Host
# header is the runtime's own, not a name a browser could be tricked into: any is served.
ACCESS = {"GATEWAY_ALLOW_ANONYMOUS": "true", "GATEWAY_ALLOWED_HOSTS": "*"}


class DeployFailed(DeployError):
    """The runtime (or its endpoint) was asked for and AgentCore failed it: exit status 2."""


@dataclass(frozen=True)
class RuntimeSpec:
    name: str
    image_uri: str  # the gateway image in ECR, by digest (deploy.preflight.resolve_image)
    role_arn: str  # the execution role AgentCore runs it as
    environment: dict[str, str] = field(default_factory=dict)  # the gateway's GATEWAY_* settings
    endpoint: str | None = None  # a named endpoint to point at the new version
    jwt_discovery_url: str | None = None  # a custom JWT authorizer instead of SigV4
    jwt_audiences: tuple[str, ...] = ()
    jwt_clients: tuple[str, ...] = ()

    def request(self) -> dict[str, Any]:
        """What CreateAgentRuntime and UpdateAgentRuntime both take."""
        fields: dict[str, Any] = {
            "agentRuntimeArtifact": {"containerConfiguration": {"containerUri": self.image_uri}},
            "roleArn": self.role_arn,
            "networkConfiguration": {"networkMode": "PUBLIC"},
            "protocolConfiguration": {"serverProtocol": "HTTP"},
            "environmentVariables": dict(self.environment),
            "description": DESCRIPTION,
        }
        if self.jwt_discovery_url:
            jwt: dict[str, Any] = {"discoveryUrl": self.jwt_discovery_url}
            if self.jwt_audiences:
                jwt["allowedAudience"] = list(self.jwt_audiences)
            if self.jwt_clients:
                jwt["allowedClients"] = list(self.jwt_clients)
            fields["authorizerConfiguration"] = {"customJWTAuthorizer": jwt}
        return fields


def gateway_environment(
    *,
    region: str | None,
    sagemaker_endpoint: str | None = None,
    model_server_url: str | None = None,
    llm: str = "bedrock",
    bedrock_model_id: str | None = None,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The runtime's environment: where speech comes from (a SageMaker endpoint or model
    servers), the LLM, the region, the access line; `extra` (--env) last, over all of them."""
    if (sagemaker_endpoint is None) == (model_server_url is None):
        raise DeployError("give one of --sagemaker-endpoint NAME or --model-server-url URL")
    env: dict[str, str] = {}
    if sagemaker_endpoint is not None:
        env |= {
            "GATEWAY_TTS_TRANSPORT": "sagemaker",
            "GATEWAY_SAGEMAKER_ENDPOINT": sagemaker_endpoint,
        }
    else:
        env |= {
            "GATEWAY_TTS_TRANSPORT": "model-server",
            "GATEWAY_MODEL_SERVER_URL": str(model_server_url),
        }
    env["GATEWAY_LLM"] = llm
    if bedrock_model_id:
        env["GATEWAY_BEDROCK_MODEL_ID"] = bedrock_model_id
    if region:
        env["GATEWAY_AWS_REGION"] = region
    return env | ACCESS | dict(extra or {})


def check_spec(spec: RuntimeSpec) -> None:
    """What can be refused before any call: names AgentCore would refuse, an image not in ECR,
    settings the gateway does not have or would refuse at start."""
    for flag, name in (("--name", spec.name), ("--endpoint", spec.endpoint)):
        if name is not None and not NAME.match(name):
            raise DeployError(
                f"{flag} {name!r}: letters, digits and underscores, starting with a letter, "
                "at most 48 characters (AgentCore's rule: kokoro_voice, not kokoro-voice)"
            )
    if spec.endpoint == DEFAULT_ENDPOINT:
        raise DeployError(f"--endpoint {DEFAULT_ENDPOINT}: AgentCore keeps that one itself")
    if ecr_region(spec.image_uri) is None:
        raise DeployError(f"--image-uri {spec.image_uri}: AgentCore runs images from ECR only")
    known = {f"{ENV_PREFIX}{name.upper()}" for name in Settings.__dataclass_fields__}
    unknown = sorted(k for k in spec.environment if k.startswith(ENV_PREFIX) and k not in known)
    if unknown:
        raise DeployError(
            f"--env {', '.join(unknown)}: not a gateway setting (docs/configuration.md)"
        )
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            settings = parse_settings([], env=spec.environment)
    except SystemExit as exc:  # argparse's way of saying a value is wrong: its last line
        why = said.getvalue().strip().splitlines()[-1].removeprefix("gateway: error: ")
        raise DeployError(f"--env {why}: the gateway would refuse it at start") from exc
    if not settings.allow_anonymous and not (settings.api_keys or settings.api_keys_file):
        raise DeployError(
            "GATEWAY_ALLOW_ANONYMOUS=false without GATEWAY_API_KEYS: the gateway would refuse "
            "to start (and AgentCore's callers cannot send its keys; docs/deployment.md)"
        )


def _not_found(exc: ClientError) -> bool:
    code: str = exc.response.get("Error", {}).get("Code", "")
    return code == "ResourceNotFoundException"


def _pages(control: Any, operation: str, key: str, **kwargs: Any) -> list[dict[str, Any]]:
    paginator = control.get_paginator(operation)
    pages = paginator.paginate(PaginationConfig={"PageSize": PAGE_SIZE}, **kwargs)
    return [item for page in pages for item in page[key]]


def _find(control: Any, name: str) -> dict[str, Any] | None:
    """The runtime of this name as GetAgentRuntime describes it, or None; refuses one this
    command did not make."""
    for summary in _pages(control, "list_agent_runtimes", "agentRuntimes"):
        if summary["agentRuntimeName"] == name:
            tags = control.list_tags_for_resource(resourceArn=summary["agentRuntimeArn"])
            if tags.get("tags", {}).get(TAG) != name:
                raise DeployError(
                    f"runtime {name!r} exists and was not made by kokoro-deploy (no tag "
                    f"{TAG}={name}): choose another --name"
                )
            current: dict[str, Any] = control.get_agent_runtime(
                agentRuntimeId=summary["agentRuntimeId"]
            )
            return current
    return None


def _same(current: dict[str, Any], wanted: dict[str, Any]) -> bool:
    """Whether the runtime's latest version is already what is asked for (an authorizer it has
    and the spec has not counts as a change)."""
    keys = {*wanted, "authorizerConfiguration"}
    empty: dict[str, Any] = {"environmentVariables": {}}
    return all(current.get(k, empty.get(k)) == wanted.get(k, empty.get(k)) for k in keys)


def _sleep(seconds: float) -> None:
    """Between two polls (the CLI's; tests record instead)."""
    time.sleep(seconds)


def _wait(
    describe: Callable[[], dict[str, Any]],
    what: str,
    logs: str,
    sleep: Callable[[float], None],
    poll_s: float,
    attempts: int,
) -> dict[str, Any]:
    for attempt in range(attempts):
        current = describe()
        status = current["status"]
        if status == "READY":
            return current
        if status in FAILED or status == "DELETING":
            reason = current.get("failureReason")
            because = f" ({reason})" if reason else ""
            raise DeployFailed(f"{what} is {status}{because}: {logs}")
        if attempt + 1 < attempts:
            sleep(poll_s)
    raise DeployFailed(
        f"{what} is still {status} after {poll_s * (attempts - 1):.0f} s: re-run to wait again"
    )


def deploy(
    spec: RuntimeSpec,
    control: Any,
    wait: bool = True,
    sleep: Callable[[float], None] | None = None,
    poll_s: float = 5.0,
    attempts: int = 120,
) -> dict[str, Any]:
    """Returns what was done, for the CLI to print. Refuses (`DeployError`) before creating
    anything when the spec or the runtime's state does not allow it; `DeployFailed` when
    AgentCore fails what was asked."""
    check_spec(spec)
    sleep = sleep or _sleep
    current = _find(control, spec.name)
    wanted = spec.request()
    done: dict[str, Any] = {"runtime": spec.name}
    if current is None:
        made = control.create_agent_runtime(
            agentRuntimeName=spec.name, tags={TAG: spec.name}, **wanted
        )
        done["runtime_action"] = "created"
    else:
        status = current["status"]
        if status in BUSY:
            raise DeployError(
                f"runtime {spec.name!r} is {status}: wait until it is READY, then re-run"
            )
        if status == "CREATE_FAILED":
            raise DeployError(
                f"runtime {spec.name!r} is CREATE_FAILED: remove it with "
                f"`kokoro-deploy agentcore-teardown --name {spec.name}`, then deploy again"
            )
        if status == "READY" and _same(current, wanted):
            made = current
            done["runtime_action"] = "unchanged"
        else:
            made = control.update_agent_runtime(agentRuntimeId=current["agentRuntimeId"], **wanted)
            done["runtime_action"] = "updated"
    runtime_id, version = made["agentRuntimeId"], made["agentRuntimeVersion"]
    done |= {"runtime_id": runtime_id, "runtime_arn": made["agentRuntimeArn"], "version": version}
    logs = (
        f"see its logs in CloudWatch (/aws/bedrock-agentcore/runtimes/{runtime_id}-*); the "
        "container must answer GET /ping on port 8080 (a gateway that refuses its settings "
        "exits at start)"
    )
    qualifier = spec.endpoint or DEFAULT_ENDPOINT
    done["qualifier"] = qualifier
    if not wait:
        done["status"] = made["status"]
        if spec.endpoint is not None:
            done["endpoint_action"] = "not pointed: re-run once the runtime is READY"
        return done
    ready = _wait(
        lambda: control.get_agent_runtime(agentRuntimeId=runtime_id, agentRuntimeVersion=version),
        f"runtime {spec.name!r} version {version}",
        logs,
        sleep,
        poll_s,
        attempts,
    )
    done["status"] = ready["status"]
    if spec.endpoint is not None:
        done["endpoint"] = spec.endpoint
        done["endpoint_action"] = _point_endpoint(control, spec, runtime_id, version)
        endpoint = _wait(
            lambda: control.get_agent_runtime_endpoint(
                agentRuntimeId=runtime_id, endpointName=qualifier
            ),
            f"endpoint {qualifier!r} of runtime {spec.name!r}",
            logs,
            sleep,
            poll_s,
            attempts,
        )
        done["endpoint_arn"] = endpoint["agentRuntimeEndpointArn"]
    return done


def how_to_invoke(runtime_arn: str, qualifier: str, region: str | None) -> str:
    """What the CLI prints last: the call that speaks through the runtime."""
    return (
        f'invoke: boto3.client("bedrock-agentcore", region_name="{region}").invoke_agent_runtime('
        f'agentRuntimeArn="{runtime_arn}", qualifier="{qualifier}", '
        "runtimeSessionId=<33 to 256 characters, one per conversation>, "
        'contentType="application/json", accept="text/event-stream", '
        """payload=b'{"prompt": "Hello there."}')"""
    )


def _point_endpoint(control: Any, spec: RuntimeSpec, runtime_id: str, version: str) -> str:
    assert spec.endpoint is not None
    try:
        current = control.get_agent_runtime_endpoint(
            agentRuntimeId=runtime_id, endpointName=spec.endpoint
        )
    except ClientError as exc:
        if not _not_found(exc):
            raise
        control.create_agent_runtime_endpoint(
            agentRuntimeId=runtime_id,
            name=spec.endpoint,
            agentRuntimeVersion=version,
            tags={TAG: spec.name},
        )
        return "created"
    if current["status"] in BUSY:
        status = current["status"]
        raise DeployError(f"endpoint {spec.endpoint!r} is {status}: wait until it is READY")
    if current.get("liveVersion") == version and current["status"] == "READY":
        return "unchanged"
    control.update_agent_runtime_endpoint(
        agentRuntimeId=runtime_id, endpointName=spec.endpoint, agentRuntimeVersion=version
    )
    return "updated"


def teardown(name: str, control: Any) -> list[str]:
    """Remove the runtime of this name (and its named endpoints) if this command made it.
    Safe to re-run."""
    current = _find(control, name)
    if current is None:
        return []
    runtime_id = current["agentRuntimeId"]
    removed: list[str] = []
    for endpoint in _pages(
        control, "list_agent_runtime_endpoints", "runtimeEndpoints", agentRuntimeId=runtime_id
    ):
        if endpoint["name"] != DEFAULT_ENDPOINT and endpoint["status"] != "DELETING":
            control.delete_agent_runtime_endpoint(
                agentRuntimeId=runtime_id, endpointName=endpoint["name"]
            )
            removed.append(f"endpoint {endpoint['name']}")
    if current["status"] != "DELETING":
        control.delete_agent_runtime(agentRuntimeId=runtime_id)
        removed.append(f"runtime {name} ({runtime_id})")
    return removed
