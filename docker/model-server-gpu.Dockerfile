# syntax=docker/dockerfile:1
# The Kokoro model server on a GPU: the torch engine (kokoro's KModel) on CUDA. What a SageMaker
# real-time endpoint (ml.g5.xlarge) runs, and the model server of `make dev-gpu` and k8s/gpu.
#
#   docker build -f docker/model-server-gpu.Dockerfile -t kokoro-model-server:gpu-0.1.0 .
#   docker run --gpus all -p 8080:8080 -v /path/to/Kokoro-82M:/opt/ml/model:ro \
#     kokoro-model-server:gpu-0.1.0 serve
#
# Weights: a Kokoro checkpoint directory (config.json, kokoro-v1_0.pth, voices/*.pt) at
# /opt/ml/model, where SageMaker unpacks the endpoint's model data. To bake one in instead, put
# it in docker/weights/ before building. Nothing is downloaded at build time but packages from
# PyPI and Ubuntu, which a registry mirror can serve.
# torch comes from uv.lock (PyPI's CUDA 13 build). Hosts with an NVIDIA driver older than 580 use
# the base image's CUDA forward-compatibility libraries (data-centre GPUs; see
# model_server/cuda_compat.py); on SageMaker deploy with an inference AMI of driver 535 or newer.

ARG CUDA_IMAGE=nvidia/cuda:13.0.1-runtime-ubuntu24.04

FROM ${CUDA_IMAGE} AS build
ENV DEBIAN_FRONTEND=noninteractive
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/uv && /opt/uv/bin/pip install --no-cache-dir uv==0.13.8
ENV UV_PROJECT_ENVIRONMENT=/opt/venv \
    UV_PYTHON_DOWNLOADS=never \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy
WORKDIR /src
# Dependencies first (a layer that survives code changes), then the project itself.
COPY pyproject.toml uv.lock README.md ./
RUN /opt/uv/bin/uv sync --frozen --no-default-groups --extra torch --no-install-project --python /usr/bin/python3
COPY kokoro_contract ./kokoro_contract
COPY model_server ./model_server
RUN /opt/uv/bin/uv sync --frozen --no-default-groups --extra torch --no-editable --python /usr/bin/python3

FROM ${CUDA_IMAGE}
LABEL com.amazonaws.sagemaker.capabilities.bidirectional-streaming=true \
      org.opencontainers.image.title="kokoro-model-server" \
      org.opencontainers.image.description="Kokoro-82M TTS, torch engine on CUDA, SageMaker container contract"
ENV DEBIAN_FRONTEND=noninteractive
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 10001 --create-home --shell /usr/sbin/nologin app
COPY --from=build /opt/venv /opt/venv
COPY --chown=10001:10001 docker/weights/ /opt/ml/model/
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HF_HOME=/home/app/.cache/huggingface \
    MODEL_SERVER_ENGINE=torch \
    MODEL_SERVER_MODEL_DIR=/opt/ml/model \
    MODEL_SERVER_DEVICE=cuda \
    MODEL_SERVER_DEFAULT_VOICE=af_heart \
    MODEL_SERVER_WORKERS=4
EXPOSE 8080
# No USER: SageMaker hosting expects containers to run as root (its custom inference
# container requirements); Kubernetes and compose run it as the `app` user (uid 10001).
HEALTHCHECK --interval=10s --timeout=3s --start-period=300s --retries=3 \
    CMD ["python3", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:8080/ping', timeout=2)"]
# SageMaker starts the container as `docker run IMAGE serve`: `serve` listens on 0.0.0.0:8080.
ENTRYPOINT ["/opt/venv/bin/serve"]
