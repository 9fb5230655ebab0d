"""`kokoro-deploy agentcore`: a Bedrock AgentCore runtime running the gateway image, call by call
with botocore's Stubber (each request and response checked against the installed service model
of `bedrock-agentcore-control`; moto has no AgentCore), the order of calls across clients
recorded. No network, no sleeping: the poll's sleep is a recorder."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import orjson
import pytest

from deploy import cli
from deploy.agentcore import (
    TAG,
    DeployFailed,
    RuntimeSpec,
    check_spec,
    deploy,
    gateway_environment,
    teardown,
)
from deploy.preflight import AGENTCORE_PRINCIPAL, check_role
from deploy.sagemaker import DeployError
from tests.support.stubbed_aws import StubbedClients

NOW = datetime(2026, 12, 1, tzinfo=UTC)
ACCOUNT = "123456789012"
NAME = "kokoro_voice"
RUNTIME_ID = "kokoro_voice-a1B2c3D4e5"
RUNTIME_ARN = f"arn:aws:bedrock-agentcore:us-east-1:{ACCOUNT}:runtime/{RUNTIME_ID}"
ENDPOINT_ARN = f"{RUNTIME_ARN}/runtime-endpoint/live"
ROLE = f"arn:aws:iam::{ACCOUNT}:role/AgentCoreGateway"
REPOSITORY = f"{ACCOUNT}.dkr.ecr.us-east-1.amazonaws.com/kokoro-gateway-agentcore"
DIGEST = "sha256:" + "ab" * 32
IMAGE = f"{REPOSITORY}@{DIGEST}"
ENV = gateway_environment(region="us-east-1", sagemaker_endpoint="kokoro-tts")


class Calls(StubbedClients):
    """Stubbed bedrock-agentcore-control, iam, sts and ecr clients, and the waits asked for."""

    def __init__(self) -> None:
        super().__init__(("bedrock-agentcore-control", "iam", "sts", "ecr"))
        self.sleeps: list[float] = []

    @property
    def control(self) -> Any:
        return self.clients["bedrock-agentcore-control"]

    def expect(
        self, method: str, response: dict[str, Any], service: str = "", **params: Any
    ) -> None:
        self.stubs[service or "bedrock-agentcore-control"].add_response(
            method, response, params or None
        )

    def refuse(self, method: str, code: str, message: str, service: str = "") -> None:
        self.stubs[service or "bedrock-agentcore-control"].add_client_error(
            method, code, message, 404 if code == "ResourceNotFoundException" else 400
        )

    def deploy(self, runtime: RuntimeSpec, **kwargs: Any) -> dict[str, Any]:
        return deploy(runtime, self.control, sleep=self.sleeps.append, **kwargs)

    def control_calls(self) -> list[str]:
        return [op for service, op in self.order if service == "bedrock-agentcore-control"]


def spec(**overrides: Any) -> RuntimeSpec:
    base: dict[str, Any] = {"name": NAME, "image_uri": IMAGE, "role_arn": ROLE, "environment": ENV}
    return RuntimeSpec(**{**base, **overrides})


def _fields(image: str = IMAGE, env: dict[str, str] = ENV) -> dict[str, Any]:
    """What CreateAgentRuntime and UpdateAgentRuntime are expected to carry."""
    return {
        "agentRuntimeArtifact": {"containerConfiguration": {"containerUri": image}},
        "roleArn": ROLE,
        "networkConfiguration": {"networkMode": "PUBLIC"},
        "protocolConfiguration": {"serverProtocol": "HTTP"},
        "environmentVariables": env,
        "description": "kokoro voice gateway (kokoro-deploy agentcore)",
    }


def _made(version: str, status: str) -> dict[str, Any]:
    return {
        "agentRuntimeArn": RUNTIME_ARN,
        "agentRuntimeId": RUNTIME_ID,
        "agentRuntimeVersion": version,
        "createdAt": NOW,
        "status": status,
    }


def _runtime(version: str, status: str, image: str = IMAGE, **extra: Any) -> dict[str, Any]:
    return {
        "agentRuntimeArn": RUNTIME_ARN,
        "agentRuntimeName": NAME,
        "agentRuntimeId": RUNTIME_ID,
        "agentRuntimeVersion": version,
        "createdAt": NOW,
        "lastUpdatedAt": NOW,
        "status": status,
        "lifecycleConfiguration": {"idleRuntimeSessionTimeout": 900, "maxLifetime": 28800},
        **_fields(image),
        **extra,
    }


def _listed(calls: Calls, tags: dict[str, str] | None = None, status: str = "READY") -> None:
    summary = {
        "agentRuntimeArn": RUNTIME_ARN,
        "agentRuntimeId": RUNTIME_ID,
        "agentRuntimeVersion": "1",
        "agentRuntimeName": NAME,
        "description": "kokoro voice gateway (kokoro-deploy agentcore)",
        "lastUpdatedAt": NOW,
        "status": status,
    }
    other = {
        **summary,
        "agentRuntimeName": "someone_else",
        "agentRuntimeId": "someone_else-0123456789",
    }
    calls.expect("list_agent_runtimes", {"agentRuntimes": [other, summary]}, maxResults=100)
    calls.expect(
        "list_tags_for_resource",
        {"tags": {TAG: NAME} if tags is None else tags},
        resourceArn=RUNTIME_ARN,
    )


def _nothing_listed(calls: Calls) -> None:
    calls.expect("list_agent_runtimes", {"agentRuntimes": []}, maxResults=100)


def test_a_new_runtime_runs_the_image_by_digest_and_is_waited_for_until_ready() -> None:
    calls = Calls()
    _nothing_listed(calls)
    calls.expect(
        "create_agent_runtime",
        _made("1", "CREATING"),
        agentRuntimeName=NAME,
        tags={TAG: NAME},
        **_fields(),
    )
    for status in ("CREATING", "CREATING", "READY"):
        calls.expect(
            "get_agent_runtime",
            _runtime("1", status),
            agentRuntimeId=RUNTIME_ID,
            agentRuntimeVersion="1",
        )
    done = calls.deploy(spec())
    calls.done()
    assert done == {
        "runtime": NAME,
        "runtime_action": "created",
        "runtime_id": RUNTIME_ID,
        "runtime_arn": RUNTIME_ARN,
        "version": "1",
        "qualifier": "DEFAULT",
        "status": "READY",
    }
    assert calls.sleeps == [5.0, 5.0]  # between the three polls, none after READY
    assert calls.control_calls() == [
        "ListAgentRuntimes",
        "CreateAgentRuntime",
        "GetAgentRuntime",
        "GetAgentRuntime",
        "GetAgentRuntime",
    ]


def test_the_runtime_environment_names_speech_llm_region_and_the_access_line() -> None:
    assert ENV == {
        "GATEWAY_TTS_TRANSPORT": "sagemaker",
        "GATEWAY_SAGEMAKER_ENDPOINT": "kokoro-tts",
        "GATEWAY_LLM": "bedrock",
        "GATEWAY_AWS_REGION": "us-east-1",
        "GATEWAY_ALLOW_ANONYMOUS": "true",  # AgentCore authenticates; said out loud
        "GATEWAY_ALLOWED_HOSTS": "*",  # the runtime's own Host header
    }
    servers = gateway_environment(
        region=None,
        model_server_url="http://10.0.0.5:8080",
        llm="openai",
        extra={"GATEWAY_OPENAI_BASE_URL": "http://10.0.0.6:8000/v1", "GATEWAY_LLM": "echo"},
    )
    assert servers == {
        "GATEWAY_TTS_TRANSPORT": "model-server",
        "GATEWAY_MODEL_SERVER_URL": "http://10.0.0.5:8080",
        "GATEWAY_LLM": "echo",  # --env has the last word
        "GATEWAY_ALLOW_ANONYMOUS": "true",
        "GATEWAY_ALLOWED_HOSTS": "*",
        "GATEWAY_OPENAI_BASE_URL": "http://10.0.0.6:8000/v1",
    }
    with pytest.raises(DeployError, match="one of --sagemaker-endpoint NAME or --model-server-url"):
        gateway_environment(region=None)


def test_an_existing_runtime_gets_a_new_version_and_an_unchanged_one_is_left_alone() -> None:
    calls = Calls()
    old = f"{REPOSITORY}@sha256:{'cd' * 32}"
    _listed(calls)
    calls.expect("get_agent_runtime", _runtime("1", "READY", image=old), agentRuntimeId=RUNTIME_ID)
    calls.expect(
        "update_agent_runtime",
        {**_made("2", "UPDATING"), "lastUpdatedAt": NOW},
        agentRuntimeId=RUNTIME_ID,
        **_fields(),
    )
    calls.expect(
        "get_agent_runtime",
        _runtime("2", "READY"),
        agentRuntimeId=RUNTIME_ID,
        agentRuntimeVersion="2",
    )
    updated = calls.deploy(spec())
    assert (updated["runtime_action"], updated["version"], updated["status"]) == (
        "updated",
        "2",
        "READY",
    )
    calls.done()
    assert calls.sleeps == []
    # the same arguments again: no new version
    _listed(calls)
    calls.expect("get_agent_runtime", _runtime("2", "READY"), agentRuntimeId=RUNTIME_ID)
    calls.expect(
        "get_agent_runtime",
        _runtime("2", "READY"),
        agentRuntimeId=RUNTIME_ID,
        agentRuntimeVersion="2",
    )
    again = calls.deploy(spec())
    calls.done()
    assert (again["runtime_action"], again["version"]) == ("unchanged", "2")
    assert calls.control_calls().count("UpdateAgentRuntime") == 1
    # an authorizer it has and the spec has not is a change
    jwt = {
        "customJWTAuthorizer": {
            "discoveryUrl": "https://id.example/.well-known/openid-configuration"
        }
    }
    _listed(calls)
    calls.expect(
        "get_agent_runtime",
        _runtime("2", "READY", authorizerConfiguration=jwt),
        agentRuntimeId=RUNTIME_ID,
    )
    calls.expect(
        "update_agent_runtime",
        {**_made("3", "UPDATING"), "lastUpdatedAt": NOW},
        agentRuntimeId=RUNTIME_ID,
        **_fields(),
    )
    assert calls.deploy(spec(), wait=False)["runtime_action"] == "updated"
    calls.done()


@pytest.mark.parametrize("failed", ["CREATE_FAILED", "UPDATE_FAILED"])
def test_a_version_agentcore_fails_is_one_clear_error(failed: str) -> None:
    calls = Calls()
    _nothing_listed(calls)
    calls.expect("create_agent_runtime", _made("1", "CREATING"))
    calls.expect("get_agent_runtime", _runtime("1", "CREATING"))
    calls.expect("get_agent_runtime", _runtime("1", failed))
    with pytest.raises(DeployFailed) as failure:
        calls.deploy(spec())
    said = str(failure.value)
    assert said.startswith(f"runtime 'kokoro_voice' version 1 is {failed}: see its logs")
    assert f"/aws/bedrock-agentcore/runtimes/{RUNTIME_ID}-" in said
    assert "\n" not in said
    calls.done()


def test_a_runtime_that_never_gets_ready_ends_the_wait_with_its_status() -> None:
    calls = Calls()
    _nothing_listed(calls)
    calls.expect("create_agent_runtime", _made("1", "CREATING"))
    for _ in range(3):
        calls.expect("get_agent_runtime", _runtime("1", "CREATING"))
    with pytest.raises(DeployFailed, match=r"is still CREATING after 20 s: re-run to wait again"):
        calls.deploy(spec(), poll_s=10.0, attempts=3)
    assert calls.sleeps == [10.0, 10.0]
    calls.done()


@pytest.mark.parametrize(
    ("status", "tags", "says"),
    [
        ("CREATING", None, "is CREATING: wait until it is READY"),
        ("UPDATING", None, "is UPDATING: wait until it is READY"),
        (
            "CREATE_FAILED",
            None,
            "is CREATE_FAILED: remove it with `kokoro-deploy agentcore-teardown",
        ),
        ("READY", {}, f"was not made by kokoro-deploy (no tag {TAG}=kokoro_voice)"),
        ("READY", {TAG: "other"}, "was not made by kokoro-deploy"),
    ],
)
def test_busy_failed_or_foreign_runtimes_are_refused_before_anything_changes(
    status: str, tags: dict[str, str] | None, says: str
) -> None:
    calls = Calls()
    _listed(calls, tags)
    if tags is None:
        calls.expect("get_agent_runtime", _runtime("1", status))
    with pytest.raises(DeployError, match=re.escape(says)):
        calls.deploy(spec())
    assert not {"CreateAgentRuntime", "UpdateAgentRuntime"} & set(calls.control_calls())
    calls.done()


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ({"name": "kokoro-voice"}, "letters, digits and underscores"),
        ({"name": "k" * 49}, "at most 48 characters"),
        ({"endpoint": "live-1"}, "--endpoint 'live-1': letters, digits"),
        ({"endpoint": "DEFAULT"}, "AgentCore keeps that one itself"),
        ({"image_uri": "docker.io/kokoro/gateway:0.1.0"}, "AgentCore runs images from ECR only"),
        ({"environment": {**ENV, "GATEWAY_MAX_SESION": "3"}}, "GATEWAY_MAX_SESION: not a gateway"),
        ({"environment": {**ENV, "GATEWAY_MAX_SESSIONS": "many"}}, "--env GATEWAY_MAX_SESSIONS: "),
        (
            {"environment": {**ENV, "GATEWAY_ALLOW_ANONYMOUS": "false"}},
            "GATEWAY_ALLOW_ANONYMOUS=false without GATEWAY_API_KEYS",
        ),
    ],
)
def test_what_agentcore_or_the_gateway_would_refuse_is_refused_up_front(
    overrides: dict[str, Any], says: str
) -> None:
    calls = Calls()
    with pytest.raises(DeployError, match=re.escape(says)):
        calls.deploy(spec(**overrides))
    assert calls.order == []
    check_spec(
        spec(
            environment={
                **ENV,
                "GATEWAY_ALLOW_ANONYMOUS": "false",
                "GATEWAY_API_KEYS": "a:" + "k" * 32,
            }
        )
    )


def _endpoint(status: str, live: str | None, **extra: Any) -> dict[str, Any]:
    found = {
        "agentRuntimeEndpointArn": ENDPOINT_ARN,
        "agentRuntimeArn": RUNTIME_ARN,
        "status": status,
        "createdAt": NOW,
        "lastUpdatedAt": NOW,
        "name": "live",
        "id": "live-0123456789",
        **extra,
    }
    return found | ({"liveVersion": live} if live else {})


def test_a_named_endpoint_is_created_then_pointed_at_each_new_version() -> None:
    calls = Calls()
    _nothing_listed(calls)
    calls.expect("create_agent_runtime", _made("1", "CREATING"))
    calls.expect("get_agent_runtime", _runtime("1", "READY"))
    calls.refuse("get_agent_runtime_endpoint", "ResourceNotFoundException", "no endpoint live")
    calls.expect(
        "create_agent_runtime_endpoint",
        {
            "targetVersion": "1",
            "agentRuntimeEndpointArn": ENDPOINT_ARN,
            "agentRuntimeArn": RUNTIME_ARN,
            "status": "CREATING",
            "createdAt": NOW,
        },
        agentRuntimeId=RUNTIME_ID,
        name="live",
        agentRuntimeVersion="1",
        tags={TAG: NAME},
    )
    calls.expect("get_agent_runtime_endpoint", _endpoint("CREATING", None))
    calls.expect(
        "get_agent_runtime_endpoint",
        _endpoint("READY", "1"),
        agentRuntimeId=RUNTIME_ID,
        endpointName="live",
    )
    done = calls.deploy(spec(endpoint="live"))
    calls.done()
    assert (done["endpoint_action"], done["endpoint_arn"], done["qualifier"]) == (
        "created",
        ENDPOINT_ARN,
        "live",
    )
    # a new version: the endpoint follows it
    _listed(calls)
    calls.expect(
        "get_agent_runtime", _runtime("1", "READY", image=f"{REPOSITORY}@sha256:{'cd' * 32}")
    )
    calls.expect("update_agent_runtime", {**_made("2", "UPDATING"), "lastUpdatedAt": NOW})
    calls.expect("get_agent_runtime", _runtime("2", "READY"))
    calls.expect("get_agent_runtime_endpoint", _endpoint("READY", "1"))
    calls.expect(
        "update_agent_runtime_endpoint",
        {
            "liveVersion": "1",
            "targetVersion": "2",
            "agentRuntimeEndpointArn": ENDPOINT_ARN,
            "agentRuntimeArn": RUNTIME_ARN,
            "status": "UPDATING",
            "createdAt": NOW,
            "lastUpdatedAt": NOW,
        },
        agentRuntimeId=RUNTIME_ID,
        endpointName="live",
        agentRuntimeVersion="2",
    )
    calls.expect(
        "get_agent_runtime_endpoint", _endpoint("UPDATE_FAILED", "1", failureReason="quota")
    )
    with pytest.raises(
        DeployFailed, match=r"endpoint 'live' of runtime 'kokoro_voice' is UPDATE_FAILED \(quota\)"
    ):
        calls.deploy(spec(endpoint="live"))
    calls.done()


def test_teardown_removes_the_runtime_and_its_named_endpoints_and_is_safe_to_repeat() -> None:
    calls = Calls()
    _listed(calls)
    calls.expect("get_agent_runtime", _runtime("2", "READY"), agentRuntimeId=RUNTIME_ID)
    default = {**_endpoint("READY", "2"), "name": "DEFAULT", "id": "DEFAULT-0123456789"}
    endpoints = [default, _endpoint("READY", "2")]
    calls.expect(
        "list_agent_runtime_endpoints",
        {"runtimeEndpoints": endpoints},
        agentRuntimeId=RUNTIME_ID,
        maxResults=100,
    )
    calls.expect(
        "delete_agent_runtime_endpoint",
        {"status": "DELETING", "agentRuntimeId": RUNTIME_ID, "endpointName": "live"},
        agentRuntimeId=RUNTIME_ID,
        endpointName="live",
    )
    calls.expect(
        "delete_agent_runtime",
        {"status": "DELETING", "agentRuntimeId": RUNTIME_ID},
        agentRuntimeId=RUNTIME_ID,
    )
    assert teardown(NAME, calls.control) == ["endpoint live", f"runtime {NAME} ({RUNTIME_ID})"]
    calls.done()
    _nothing_listed(calls)
    assert teardown(NAME, calls.control) == []
    calls.done()
    # someone else's runtime of that name is never deleted
    _listed(calls, tags={})
    with pytest.raises(DeployError, match="was not made by kokoro-deploy"):
        teardown(NAME, calls.control)
    assert calls.control_calls().count("DeleteAgentRuntime") == 1  # the first teardown's
    calls.done()


# --- IAM: the runtime's role trusts AgentCore -----------------------------------------------

AGENTCORE_TRUST = {
    "Version": "2012-10-17",
    "Statement": [
        {
            "Effect": "Allow",
            "Principal": {"Service": "bedrock-agentcore.amazonaws.com"},
            "Action": "sts:AssumeRole",
        }
    ],
}


def _role(trust: dict[str, Any]) -> dict[str, Any]:
    return {
        "Role": {
            "Path": "/",
            "RoleName": "AgentCoreGateway",
            "RoleId": "AROAEXAMPLEEXAMPLE1",
            "Arn": ROLE,
            "CreateDate": NOW,
            "AssumeRolePolicyDocument": orjson.dumps(trust).decode(),
        }
    }


def _caller_may_pass(calls: Calls, decision: str = "allowed") -> None:
    caller = f"arn:aws:iam::{ACCOUNT}:user/dev"
    identity = {"UserId": "AIDAEXAMPLE", "Account": ACCOUNT, "Arn": caller}
    calls.expect("get_caller_identity", identity, service="sts")
    result = {"EvalActionName": "iam:PassRole", "EvalResourceName": ROLE, "EvalDecision": decision}
    calls.expect(
        "simulate_principal_policy",
        {"EvaluationResults": [result]},
        service="iam",
        PolicySourceArn=caller,
        ActionNames=["iam:PassRole"],
        ResourceArns=[ROLE],
        ContextEntries=[  # the guide's policy allows PassRole only to AgentCore
            {
                "ContextKeyName": "iam:PassedToService",
                "ContextKeyValues": [AGENTCORE_PRINCIPAL],
                "ContextKeyType": "string",
            }
        ],
    )


def test_the_runtime_role_must_trust_agentcore_and_be_passable() -> None:
    calls = Calls()
    iam, sts = calls.clients["iam"], calls.clients["sts"]
    calls.expect("get_role", _role(AGENTCORE_TRUST), service="iam", RoleName="AgentCoreGateway")
    _caller_may_pass(calls)
    assert check_role(ROLE, iam, sts, AGENTCORE_PRINCIPAL) == []
    sagemaker_only = orjson.loads(
        orjson.dumps(AGENTCORE_TRUST).replace(b"bedrock-agentcore", b"sagemaker")
    )
    calls.expect("get_role", _role(sagemaker_only), service="iam")
    with pytest.raises(
        DeployError, match=r"does not let bedrock-agentcore\.amazonaws\.com assume it"
    ):
        check_role(ROLE, iam, sts, AGENTCORE_PRINCIPAL)
    calls.expect("get_role", _role(AGENTCORE_TRUST), service="iam")
    _caller_may_pass(calls, "implicitDeny")
    with pytest.raises(DeployError, match=r"may not pass .* to Bedrock AgentCore"):
        check_role(ROLE, iam, sts, AGENTCORE_PRINCIPAL)
    calls.done()


# --- the command ----------------------------------------------------------------------------


def _cli(calls: Calls, monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> None:
    """`kokoro-deploy` with its boto3 clients the stubbed ones, the poll's sleep recorded."""
    monkeypatch.setattr("deploy.cli.boto3.client", lambda service, **_: calls.clients[service])
    monkeypatch.setattr("deploy.agentcore._sleep", calls.sleeps.append)
    cli.main(argv)


ARGV = [
    "agentcore",
    "--name",
    NAME,
    "--image-uri",
    f"{REPOSITORY}:0.1.0",
    "--role-arn",
    ROLE,
    "--sagemaker-endpoint",
    "kokoro-tts",
]


def _preflight(calls: Calls) -> None:
    calls.expect("get_role", _role(AGENTCORE_TRUST), service="iam")
    _caller_may_pass(calls)
    calls.expect(
        "describe_images",
        {"imageDetails": [{"imageDigest": DIGEST, "imageTags": ["0.1.0"]}]},
        service="ecr",
        registryId=ACCOUNT,
        repositoryName="kokoro-gateway-agentcore",
        imageIds=[{"imageTag": "0.1.0"}],
    )


def test_the_command_deploys_the_tag_by_digest_and_says_how_to_invoke(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = Calls()
    _preflight(calls)
    _nothing_listed(calls)
    calls.expect(
        "create_agent_runtime",
        _made("1", "CREATING"),
        agentRuntimeName=NAME,
        tags={TAG: NAME},
        **_fields(env=ENV),
    )
    calls.expect("get_agent_runtime", _runtime("1", "READY"))
    _cli(calls, monkeypatch, ARGV)
    calls.done()
    out = capsys.readouterr().out
    assert f"image: {IMAGE}\n" in out
    assert f"runtime_arn: {RUNTIME_ARN}\n" in out
    assert "status: READY\n" in out
    assert f'invoke_agent_runtime(agentRuntimeArn="{RUNTIME_ARN}", qualifier="DEFAULT"' in out
    assert "runtimeSessionId=" in out
    # preflight first, then AgentCore
    assert [s for s, _ in calls.order][:4] == ["iam", "sts", "iam", "ecr"]


def test_the_command_says_a_failed_runtime_in_one_line_with_status_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = Calls()
    _preflight(calls)
    _nothing_listed(calls)
    calls.expect("create_agent_runtime", _made("1", "CREATING"))
    calls.expect("get_agent_runtime", _runtime("1", "CREATING"))
    calls.expect("get_agent_runtime", _runtime("1", "CREATE_FAILED"))
    with pytest.raises(SystemExit) as exit_info:
        _cli(calls, monkeypatch, ARGV)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    (line,) = err.strip().splitlines()
    assert line.startswith("kokoro-deploy: runtime 'kokoro_voice' version 1 is CREATE_FAILED: ")
    assert "Traceback" not in err
    assert calls.sleeps == [5.0]


def test_the_command_refuses_in_one_line_with_status_1_before_any_call(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = Calls()
    with pytest.raises(SystemExit) as exit_info:
        _cli(calls, monkeypatch, [*ARGV[:2], "kokoro-voice", *ARGV[3:]])
    assert exit_info.value.code == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "--name 'kokoro-voice': letters, digits and underscores" in line
    assert calls.order == []


def test_the_teardown_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = Calls()
    _nothing_listed(calls)
    _cli(calls, monkeypatch, ["agentcore-teardown", "--name", NAME])
    assert capsys.readouterr().out == "nothing to remove\n"
    calls.done()


# --- the guide ------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]


def _calls_in_source() -> set[str]:
    """The control-plane operations deploy/agentcore.py calls: `control.method(` and the
    paginated `_pages(control, "method"`, as AgentCore's operation names."""
    source = (ROOT / "deploy" / "agentcore.py").read_text()
    methods = set(re.findall(r"control\.(\w+)\(", source))
    methods |= set(re.findall(r'_pages\(\s*control,\s*"(\w+)"', source))
    methods -= {"get_paginator"}
    client = boto3.client("bedrock-agentcore-control", region_name="us-east-1")
    mapping: dict[str, str] = client.meta.method_to_api_mapping
    assert methods <= set(mapping), methods - set(mapping)
    return {mapping[m] for m in methods}


def test_the_guide_gives_the_roles_trust_and_every_action_the_command_needs() -> None:
    guide = (ROOT / "docs" / "deployment.md").read_text()
    section = guide.split("## Bedrock AgentCore Runtime", 1)[1].split("\n## ", 1)[0]
    iam = section.split("### AgentCore IAM", 1)[1]
    trust, role, caller = (
        orjson.loads(block) for block in re.findall(r"```json\n(.*?)```", iam, re.S)
    )
    assert trust["Statement"][0]["Principal"] == {"Service": AGENTCORE_PRINCIPAL}

    def actions(policy: dict[str, Any]) -> set[str]:
        found: set[str] = set()
        for statement in policy["Statement"]:
            action = statement["Action"]
            found |= {action} if isinstance(action, str) else set(action)
        return found

    assert {"ecr:BatchGetImage", "logs:PutLogEvents"} <= actions(role)
    assert "bedrock:InvokeModelWithResponseStream" in actions(role)  # --llm bedrock
    made = _calls_in_source()
    assert {"CreateAgentRuntime", "UpdateAgentRuntime", "DeleteAgentRuntime"} <= made
    needed = {f"bedrock-agentcore:{op}" for op in made} | {"bedrock-agentcore:TagResource"}
    needed |= {"iam:PassRole", "iam:GetRole", "iam:SimulatePrincipalPolicy", "ecr:DescribeImages"}
    assert needed - actions(caller) == set()
    assert "X-Amzn-Bedrock-AgentCore-Runtime-Session-Id" in section
    assert "invoke_agent_runtime(" in section
    assert "GATEWAY_ALLOW_ANONYMOUS=true" in section  # the access decision, said
