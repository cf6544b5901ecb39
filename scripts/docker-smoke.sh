#!/usr/bin/env bash
# The Docker demo, for real: builds the image, checks that a container without the privileges bubblewrap
# needs refuses to serve, runs it as compose.yaml does (privileged, data in a volume), submits a job,
# checks that the job ran inside bubblewrap and that its result link survives a container restart.
#
#   bash scripts/docker-smoke.sh            # docker where an engine runs, else podman
#
# Where no image registry is reachable (these development machines), it first builds the base image
# locally with mmdebstrap (Debian bookworm's Python 3.11) and takes torch's CPU wheel from
# $WHEELS (default /opt/wheels) instead of PyTorch's index, and gives pip this host's certificate
# authorities; podman then runs with runc and a
# containers.conf without limits. Loopback only; bounded waits.
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE=${IMAGE:-tvm-playground}
PORT=${SMOKE_PORT:-18000}
NAME=playground-smoke
VOLUME=playground-smoke-data
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

if docker info >/dev/null 2>&1; then
    engine=(docker)
    build=(docker build -t "$IMAGE" .)
else
    command -v podman >/dev/null || { echo "needs docker (with an engine) or podman" >&2; exit 2; }
    printf '[containers]\ndefault_ulimits = []\npids_limit = 0\n[engine]\ncgroup_manager = "cgroupfs"\n' \
        > "$WORK/containers.conf"
    export CONTAINERS_CONF=$WORK/containers.conf
    engine=(podman --runtime runc)
    build=(podman build --isolation chroot -t "$IMAGE")
    if ! podman image exists python:3.11-slim-bookworm && ! podman pull -q python:3.11-slim-bookworm 2>/dev/null; then
        if ! podman image exists localhost/playground-base; then
            echo "== building the base image with mmdebstrap (no registry here)"
            mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates bookworm \
                "$WORK/base.tar"
            podman import -q "$WORK/base.tar" localhost/playground-base >/dev/null
        fi
        build+=(--build-arg BASE=localhost/playground-base)
    fi
    wheels=${WHEELS:-/opt/wheels}
    pip_args=""
    if [ -n "$(ls "$wheels"/torch-2.13.0+cpu-*.whl 2>/dev/null)" ]; then
        build+=(-v "$wheels:/wheels:ro" --build-arg "TORCH_PIP=torch==2.13.0")
        pip_args="--find-links /wheels"
    fi
    # this host's certificate authorities (a proxy's among them) for pip inside the build
    build+=(-v /etc/ssl/certs/ca-certificates.crt:/host-ca.crt:ro --build-arg CA_FILE=/host-ca.crt)
    build+=(--build-arg "PIP_ARGS=$pip_args")
    build+=(.)
fi

echo "== ${build[*]}"
start=$(date +%s)
"${build[@]}"
echo "built in $(($(date +%s) - start)) s; image size: $("${engine[@]}" image inspect "$IMAGE" --format '{{.Size}}') bytes"

cleanup() {
    "${engine[@]}" rm -f "$NAME" >/dev/null 2>&1 || true
    "${engine[@]}" volume rm -f "$VOLUME" >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
cleanup_container() { "${engine[@]}" rm -f "$NAME" >/dev/null 2>&1 || true; }

echo "== without privileges: the entry point must refuse to serve unjailed"
if out=$("${engine[@]}" run --rm "$IMAGE" 2>&1); then
    echo "FAIL: it served without the sandbox"; exit 1
fi
grep -q "will not run uploaded models unjailed" <<<"$out" || { echo "FAIL: $out"; exit 1; }
echo "ok: refused ($(grep -m1 '^error' <<<"$out"))"

run_container() {  # as compose.yaml: privileged, data in a volume; no emulated boards (speed)
    "${engine[@]}" run -d --name "$NAME" --privileged -v "$VOLUME:/data" -p "127.0.0.1:$PORT:8000" \
        -e PLAYGROUND_EMULATED_BOARDS=0 "$IMAGE" >/dev/null
    for _ in $(seq 1 120); do
        curl -sf "http://127.0.0.1:$PORT/" >/dev/null && return 0
        sleep 1
    done
    "${engine[@]}" logs "$NAME" | tail -30
    echo "FAIL: no answer on port $PORT"; exit 1
}

echo "== run (privileged, volume $VOLUME) and submit the mlp example"
run_container
if curl -s "http://127.0.0.1:$PORT/" | grep -qi "without the sandbox\|unsandboxed"; then
    echo "FAIL: the page says the sandbox is off"; exit 1
fi
answer=$(curl -s -F example=mlp -F target=x86-host "http://127.0.0.1:$PORT/api/jobs")
echo "$answer"
id=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["id"])' "$answer")
jailed=no
for _ in $(seq 1 600); do
    if "${engine[@]}" exec "$NAME" ps -eo args | grep -q "^bwrap .*$id"; then jailed=yes; fi
    status=$(curl -s "http://127.0.0.1:$PORT/api/jobs/$id" | python3 -c 'import json,sys; print(json.load(sys.stdin)["status"])')
    [ "$status" = done ] || [ "$status" = failed ] && break
    sleep 0.5
done
echo "job $id: $status; seen running inside bubblewrap: $jailed"
[ "$status" = done ] && [ "$jailed" = yes ] || { "${engine[@]}" logs "$NAME" | tail -30; exit 1; }
curl -s "http://127.0.0.1:$PORT/api/jobs/$id" | python3 -c '
import json, sys
for b in json.load(sys.stdin)["results"]["benchmarks"]:
    print("  %-12s %-6s %-7s median %.3f ms" % (b["runtime"], b["variant"], "tuned" if b["tuned"] else "", b["median_ms"]))'

echo "== a new container on the same volume: the result link still answers"
cleanup_container
run_container
code=$(curl -s -o "$WORK/page.html" -w '%{http_code}' "http://127.0.0.1:$PORT/r/$id")
status=$(curl -s "http://127.0.0.1:$PORT/api/jobs/$id" | python3 -c 'import json,sys; print(json.load(sys.stdin)["status"])')
echo "GET /r/$id after the restart: $code, status $status"
[ "$code" = 200 ] && [ "$status" = done ] || exit 1
echo "docker smoke: ok"
