# syntax=docker/dockerfile:1
# The crewfence image: `crewfence-sidecar` (the default command) and `crewfence-operator`
# (the chart overrides the command). NOT built by this repository's tests or CI: the build
# machines have no container runtime. Build it where you have one:
#
#   docker build -t ghcr.io/crewfence/crewfence:0.1.0 .
#
# The chart's default image for both the operator and the sidecar is this one.

ARG PYTHON_VERSION=3.12

FROM python:${PYTHON_VERSION}-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY sidecar/ sidecar/
COPY operator/ operator/
# The sidecar extra brings crewai; the operator extra brings kopf and the kubernetes client.
RUN python -m venv /opt/crewfence \
 && /opt/crewfence/bin/pip install --upgrade pip \
 && /opt/crewfence/bin/pip install '.[sidecar,operator]'

FROM python:${PYTHON_VERSION}-slim
# Nothing may call a hosted model's telemetry: crewai and OpenTelemetry stay off.
ENV PATH=/opt/crewfence/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    CREWAI_DISABLE_TELEMETRY=true \
    CREWAI_DISABLE_TRACKING=true \
    CREWAI_TRACING_ENABLED=false \
    OTEL_SDK_DISABLED=true \
    HOME=/home/crewfence \
    CREWAI_STORAGE_DIR=/var/run/crewfence/crewai
# The uid/gid match the operator's pod securityContext (runAsUser/fsGroup 10001).
RUN groupadd --gid 10001 crewfence \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /home/crewfence \
      --shell /usr/sbin/nologin crewfence \
 && install -d -o 10001 -g 10001 -m 0700 /home/crewfence /var/run/crewfence
COPY --from=build /opt/crewfence /opt/crewfence
USER 10001:10001
WORKDIR /home/crewfence
EXPOSE 8090
ENTRYPOINT []
CMD ["crewfence-sidecar"]
