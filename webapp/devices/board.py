"""An emulated board's RPC server. It runs inside the board's jail, in the arm64 root file system's
Python under qemu-aarch64, with only the TVM runtime: standard library and tvm, no project imports.

It is TVM's own server loop (tvm.rpc.server._listen_loop: register with the tracker under the key,
serve each session in a forked child) with two changes. The jail has no network, so the server
listens on a Unix socket it inherits from the pool and reaches the tracker through another, both
relayed by the pool. And a
session that crashes (a kernel with an instruction the core lacks dies of SIGILL) ends that session,
not the board: the loop registers again. `playground.board_info` tells a client which board it got.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
import time
from typing import NoReturn

import tvm_ffi
from tvm.rpc import base, server


def main() -> NoReturn:  # serves until the pool stops it
    parser = argparse.ArgumentParser()
    parser.add_argument("--key", required=True, help="the tracker key, e.g. rpi5")
    parser.add_argument("--name", required=True, help="this board, e.g. 'rpi5 (emulated: QEMU cortex-a76)'")
    parser.add_argument("--port", type=int, required=True, help="the port clients reach it on (relayed)")
    parser.add_argument("--listen-fd", type=int, required=True, help="the listening Unix socket it inherits")
    parser.add_argument("--tracker", required=True, help="Unix socket relayed to the tracker")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s board: %(message)s")

    info = {"name": args.name, "key": args.key, "emulated": True, "cores": os.cpu_count()}
    info["threads"] = int(os.environ.get("TVM_NUM_THREADS") or os.cpu_count() or 1)
    tvm_ffi.register_global_func("playground.board_info", lambda: json.dumps(info), override=True)

    def connect_tracker(addr, timeout=60, retry_period=5):
        time.sleep(1.0)  # tracker down: retry each second (the loop calls this again on failure)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(args.tracker)
        return sock

    base.connect_with_retry = connect_tracker
    listen = socket.socket(fileno=args.listen_fd)  # made by the pool, outside the jail
    logging.info("%s ready (key %s, port %d)", args.name, args.key, args.port)
    while True:
        try:
            server._listen_loop(listen, args.port, args.key, ("tracker", 0), None, "127.0.0.1")
        except Exception as exc:  # a session that crashed, or the tracker gone: register again
            logging.warning("session ended abnormally: %s; registering again", exc)
            os.chdir("/")


if __name__ == "__main__":
    sys.exit(main())
