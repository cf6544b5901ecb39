# The one-command demo: `docker compose up` (compose.yaml). The per-job sandbox is bubblewrap, which
# creates namespaces: the container must be privileged (compose.yaml says so), or the entry point refuses
# to serve unless PLAYGROUND_UNSANDBOXED=1 says to run models unjailed.
# BASE, TORCH_PIP, PIP_ARGS and CA_FILE let scripts/docker-smoke.sh build where no image registry is
# reachable (CA_FILE: certificate authorities for pip, its build subprocesses included).
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}
ARG TORCH_PIP="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
ARG PIP_ARGS=""
ARG CA_FILE=""
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap graphviz g++ llvm-19 procps \
    g++-aarch64-linux-gnu mmdebstrap arch-test qemu-user-static \
    g++-riscv64-linux-gnu libc6-dev-riscv64-cross \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /venv
ENV PATH=/venv/bin:$PATH
WORKDIR /app
COPY pyproject.toml README.md ./
COPY webapp webapp
# The CPU build of torch first, so that nothing pulls a CUDA build.
RUN if [ -n "$CA_FILE" ]; then export PIP_CERT="$CA_FILE"; fi \
    && pip install --no-cache-dir $PIP_ARGS $TORCH_PIP && pip install --no-cache-dir $PIP_ARGS -e .
COPY templates templates
COPY lab_starters lab_starters
COPY static static
COPY scripts scripts
ENV PLAYGROUND_DATA=/data HOST=0.0.0.0 PORT=8000
VOLUME /data
EXPOSE 8000
CMD ["bash", "scripts/docker-entrypoint.sh"]
