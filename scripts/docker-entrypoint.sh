#!/usr/bin/env bash
# Serve with the per-job bubblewrap sandbox when the container allows it; otherwise say so loudly.
set -euo pipefail
if ! bwrap --ro-bind / / --unshare-net --unshare-pid --proc /proc --dev /dev true 2>/dev/null; then
    echo "WARNING: bubblewrap cannot create namespaces in this container (Docker's default seccomp/AppArmor)." >&2
    echo "WARNING: serving WITHOUT the per-job sandbox. Run with --security-opt seccomp=unconfined" >&2
    echo "WARNING: --security-opt apparmor=unconfined to keep it." >&2
    export PLAYGROUND_UNSANDBOXED=1
fi
exec tvm-playground serve
