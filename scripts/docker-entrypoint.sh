#!/usr/bin/env bash
# Serve with the per-job bubblewrap sandbox; where the container does not allow it, refuse (unless
# PLAYGROUND_UNSANDBOXED=1 asks to run models unjailed, which every page then says).
set -euo pipefail
if ! bwrap --ro-bind / / --unshare-net --unshare-pid --proc /proc --dev /dev true 2>/dev/null; then
    if [ "${PLAYGROUND_UNSANDBOXED:-0}" != 1 ]; then
        cat >&2 <<'MSG'
error: bubblewrap, the per-job sandbox, cannot create namespaces in this container (Docker's default
security profile forbids it), and this server will not run uploaded models unjailed. Start it with
    docker compose up                     (compose.yaml runs the container privileged)
or  docker run --privileged -p 8000:8000 -v playground-data:/data tvm-playground
or, for a trusted demo only, -e PLAYGROUND_UNSANDBOXED=1 to serve without the sandbox.
MSG
        exit 1
    fi
    echo "WARNING: serving WITHOUT the per-job sandbox (PLAYGROUND_UNSANDBOXED=1)." >&2
fi
exec tvm-playground serve
