"""The device pool: TVM's RPC tracker and the boards registered with it under a target's key.

`pool` runs the tracker and the emulated boards (and keeps them alive), `rootfs` builds the arm64
root file system they run in, `board` is the RPC server an emulated board runs (under QEMU, jailed),
and `tracker` speaks the tracker's protocol in plain Python, for the web's pool status and for the
remote stage's board requests. Only `board` and the tracker process itself load TVM.
"""
