# Local stand-in for Flower's flwr/base image (framework/docker/base/ubuntu/Dockerfile in
# adap/flower): same user (app, uid 49999), home and WORKDIR /app, venv /python/venv first on PATH,
# same environment; built on Debian bookworm (python3 3.11) with `pip install flwr==FLWR_VERSION`.
# apt-get needs the network (e2e/images/build.sh builds with --network=host). pip installs from
# PyPI, or, with PIP_OPTS="--no-index --find-links /wheels" and a wheel directory mounted there
# (what build.sh does: the host's pip downloads them), offline.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
ARG FLWR_VERSION
ARG PIP_OPTS=
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
    && apt-get -y --no-install-recommends install python3 python3-venv libsqlite3-0 ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --no-create-home --home-dir /app -c "" --uid 49999 app \
    && mkdir -p /app \
    && chown -R app:app /app
RUN python3 -m venv /python/venv \
    && /python/venv/bin/pip install --no-cache-dir --disable-pip-version-check ${PIP_OPTS} "flwr==${FLWR_VERSION}" \
    && chown -R app:app /python/venv
ENV PATH=/python/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONIOENCODING=UTF-8 \
    LANG=C.UTF-8 \
    LC_ALL=C.UTF-8
WORKDIR /app
USER app
ENV HOME=/app
