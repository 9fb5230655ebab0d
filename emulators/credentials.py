"""Where AWS compute gets its credentials, over loopback, in the real wire formats:

- the container credentials endpoint (ECS/Fargate, EKS Pod Identity): `GET` answers
  `{"AccessKeyId", "SecretAccessKey", "Token", "Expiration"}`; the caller finds it through
  `AWS_CONTAINER_CREDENTIALS_FULL_URI` (and sends `AWS_CONTAINER_AUTHORIZATION_TOKEN` as its
  `Authorization` header when set);
- STS `AssumeRoleWithWebIdentity` (EKS IRSA): a form `POST /` answered in STS's XML; the caller
  reads its token from `AWS_WEB_IDENTITY_TOKEN_FILE` and finds this through
  `AWS_ENDPOINT_URL_STS`.

Each fetch is answered with the next of `CredentialsScript.issued` (the last one repeated), with
its `Expiration` that many seconds from now, and recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response


@dataclass(frozen=True)
class Issued:
    access_key_id: str
    secret_access_key: str
    session_token: str
    expires_in_s: float = 3600.0

    def expiration(self) -> str:
        return (datetime.now(UTC) + timedelta(seconds=self.expires_in_s)).strftime(
            "%Y-%m-%dT%H:%M:%SZ"
        )


@dataclass
class CredentialsScript:
    issued: list[Issued]
    fetches: list[dict[str, str]] = field(default_factory=list)  # what each fetch carried

    def next(self) -> Issued:
        return self.issued[min(len(self.fetches) - 1, len(self.issued) - 1)]


def create_credentials_emulator(script: CredentialsScript) -> FastAPI:
    app = FastAPI()

    @app.get("/credentials")
    async def container(request: Request) -> Response:
        script.fetches.append({"authorization": request.headers.get("authorization", "")})
        issued = script.next()
        return JSONResponse(
            {
                "AccessKeyId": issued.access_key_id,
                "SecretAccessKey": issued.secret_access_key,
                "Token": issued.session_token,
                "Expiration": issued.expiration(),
            }
        )

    @app.post("/")
    async def sts(request: Request) -> Response:
        form = {k: v[0] for k, v in parse_qs((await request.body()).decode()).items()}
        script.fetches.append(form)
        if form.get("Action") != "AssumeRoleWithWebIdentity":
            return Response(status_code=400)
        issued = script.next()
        body = f"""<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <AssumeRoleWithWebIdentityResult>
    <Credentials>
      <AccessKeyId>{issued.access_key_id}</AccessKeyId>
      <SecretAccessKey>{issued.secret_access_key}</SecretAccessKey>
      <SessionToken>{issued.session_token}</SessionToken>
      <Expiration>{issued.expiration()}</Expiration>
    </Credentials>
    <AssumedRoleUser>
      <Arn>{form.get("RoleArn", "")}/{form.get("RoleSessionName", "")}</Arn>
      <AssumedRoleId>AROAEXAMPLE:{form.get("RoleSessionName", "")}</AssumedRoleId>
    </AssumedRoleUser>
  </AssumeRoleWithWebIdentityResult>
  <ResponseMetadata><RequestId>00000000-0000-0000-0000-000000000000</RequestId></ResponseMetadata>
</AssumeRoleWithWebIdentityResponse>"""
        return Response(body, media_type="text/xml")

    return app
