# One-command demo: docker build -t tvm-playground . && docker run --rm -p 8000:8000 tvm-playground
FROM python:3.11-slim-bookworm
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap graphviz g++ \
    g++-aarch64-linux-gnu mmdebstrap arch-test qemu-user-static \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY webapp webapp
# The CPU build of torch first, so that nothing pulls a CUDA build.
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
    && pip install --no-cache-dir -e .
COPY templates templates
COPY static static
COPY scripts scripts
ENV PLAYGROUND_DATA=/data HOST=0.0.0.0 PORT=8000
VOLUME /data
EXPOSE 8000
CMD ["bash", "scripts/docker-entrypoint.sh"]
