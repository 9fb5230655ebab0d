"""What `kokoro-deploy sagemaker` and `kokoro-deploy agentcore` check before they create
anything: the execution role (it exists, the service may assume it, the caller may pass it) and
the image (its tag resolved to the digest ECR holds now, so a re-pushed tag is a new model or a
new runtime version). A check the caller has no permission to make is reported and skipped,
never guessed."""

from __future__ import annotations

import re
from typing import Any

from botocore.exceptions import ClientError

from deploy.sagemaker import DeployError

SAGEMAKER_PRINCIPAL = "sagemaker.amazonaws.com"
AGENTCORE_PRINCIPAL = "bedrock-agentcore.amazonaws.com"
_SERVICES = {SAGEMAKER_PRINCIPAL: "SageMaker", AGENTCORE_PRINCIPAL: "Bedrock AgentCore"}
_ECR = re.compile(
    r"^(?P<host>(?P<registry>\d{12})\.dkr\.ecr(?:-fips)?\.(?P<region>[a-z0-9-]+)"
    r"\.amazonaws\.com(?:\.cn)?)/(?P<repository>[^:@]+)(?::(?P<tag>[^@]+))?(?:@(?P<digest>.+))?$"
)
_ASSUMED = re.compile(r"^arn:(?P<p>[\w-]+):sts::(?P<account>\d+):assumed-role/(?P<role>[^/]+)/")


def ecr_region(image_uri: str) -> str | None:
    found = _ECR.match(image_uri)
    return found["region"] if found else None


def resolve_image(image_uri: str, ecr: Any) -> tuple[str, str | None]:
    """(the image by digest, a note); images outside ECR are used as given."""
    found = _ECR.match(image_uri)
    if found is None:
        return image_uri, f"{image_uri} is not an ECR image: deployed by its name as given"
    if found["digest"]:
        return image_uri, None
    tag = found["tag"] or "latest"
    try:
        details = ecr.describe_images(
            registryId=found["registry"],
            repositoryName=found["repository"],
            imageIds=[{"imageTag": tag}],
        )["imageDetails"]
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code in ("ImageNotFoundException", "RepositoryNotFoundException"):
            raise DeployError(f"--image-uri {image_uri}: not in ECR ({code})") from exc
        raise
    digest = details[0]["imageDigest"]
    return f"{found['host']}/{found['repository']}@{digest}", None


def _allows(trust: dict[str, Any], principal: str) -> bool:
    statements = trust.get("Statement", [])
    for statement in statements if isinstance(statements, list) else [statements]:
        actions = statement.get("Action", [])
        actions = [actions] if isinstance(actions, str) else actions
        services = statement.get("Principal", {}).get("Service", [])
        services = [services] if isinstance(services, str) else services
        if (
            statement.get("Effect") == "Allow"
            and {"sts:AssumeRole", "sts:*", "*"} & set(actions)
            and principal in services
        ):
            return True
    return False


def _passed_to(principal: str) -> dict[str, Any]:
    """The context PassRole is asked in: a policy that allows it only with the condition
    `iam:PassedToService` (as the guide's do) is denied by a simulation without it."""
    return {
        "ContextKeyName": "iam:PassedToService",
        "ContextKeyValues": [principal],
        "ContextKeyType": "string",
    }


def _caller_arn(sts: Any) -> str | None:
    """The caller as an IAM principal SimulatePrincipalPolicy takes (a user or a role)."""
    arn: str = sts.get_caller_identity()["Arn"]
    assumed = _ASSUMED.match(arn)
    if assumed:
        return f"arn:{assumed['p']}:iam::{assumed['account']}:role/{assumed['role']}"
    return arn if ":user/" in arn or ":role/" in arn else None


def check_role(
    role_arn: str, iam: Any, sts: Any, principal: str = SAGEMAKER_PRINCIPAL
) -> list[str]:
    """Refuses a role the service (`principal`) could not use; returns notes on the checks it
    had to skip."""
    notes: list[str] = []
    name = role_arn.rsplit("/", 1)[-1]
    try:
        role = iam.get_role(RoleName=name)["Role"]
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code == "NoSuchEntity":
            raise DeployError(f"--role-arn {role_arn}: no such role") from exc
        if code not in ("AccessDenied", "AccessDeniedException"):
            raise
        notes.append("the role was not checked (no iam:GetRole)")
    else:
        if role["Arn"] != role_arn:
            raise DeployError(f"--role-arn {role_arn}: the role {name!r} is {role['Arn']}")
        if not _allows(role["AssumeRolePolicyDocument"], principal):
            raise DeployError(
                f"--role-arn {role_arn}: its trust policy does not let {principal} "
                "assume it (sts:AssumeRole); see docs/deployment.md, IAM"
            )
    caller = _caller_arn(sts)
    if caller is None:
        notes.append("iam:PassRole was not checked (the caller is not an IAM user or role)")
        return notes
    try:
        (result,) = iam.simulate_principal_policy(
            PolicySourceArn=caller,
            ActionNames=["iam:PassRole"],
            ResourceArns=[role_arn],
            ContextEntries=[_passed_to(principal)],
        )["EvaluationResults"]
    except ClientError as exc:  # no iam:SimulatePrincipalPolicy
        notes.append(f"iam:PassRole was not checked ({exc.response['Error'].get('Code')})")
        return notes
    if result["EvalDecision"] != "allowed":
        raise DeployError(
            f"{caller} may not pass {role_arn} to {_SERVICES[principal]} (iam:PassRole is "
            f"{result['EvalDecision']}); see docs/deployment.md, IAM"
        )
    return notes
