"""What one Arm vector instruction costs under QEMU (the emulated boards), in ns: each instruction 16
times in a loop of inline assembly, cross-compiled with Debian's aarch64 gcc and run by
qemu-aarch64-static as the board's core. Under QEMU a float vector instruction is a call into its
soft-float code and most integer ones run inline, so an emulated board's times weigh instructions
unlike a real core: read the boards' figures with this table beside them.

    .venv/bin/python benchmarks/qemu_instructions.py [--cpu cortex-a76] [--loops 2000000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

INSTRUCTIONS = {
    "sdot": "sdot v1.4s, v0.16b, v2.16b",
    "sdot (indexed)": "sdot v1.4s, v0.16b, v2.4b[1]",
    "smull (8b -> 8h)": "smull v1.8h, v0.8b, v2.8b",
    "smlal (8b -> 8h)": "smlal v1.8h, v0.8b, v2.8b",
    "sadalp": "sadalp v1.4s, v0.8h",
    "ld1r": "ld1r {v1.4s}, [%0]",
    "ldp (q)": "ldp q1, q3, [%0]",
    "add .4s": "add v1.4s, v0.4s, v2.4s",
    "smax .4s": "smax v1.4s, v0.4s, v2.4s",
    "smull (2s -> 2d)": "smull v1.2d, v0.2s, v2.2s",
    "sshr .2d": "sshr v1.2d, v0.2d, #17",
    "sqrdmulh .4s": "sqrdmulh v1.4s, v0.4s, v2.4s",
    "srshl .4s": "srshl v1.4s, v0.4s, v2.4s",
    "sqxtn": "sqxtn v1.4h, v0.4s",
    "scvtf": "scvtf v1.4s, v0.4s",
    "fmul": "fmul v1.4s, v0.4s, v2.4s",
    "fadd": "fadd v1.4s, v0.4s, v2.4s",
    "fmla": "fmla v1.4s, v0.4s, v2.4s",
    "fmax": "fmax v1.4s, v0.4s, v2.4s",
    "fcvtms": "fcvtms v1.4s, v0.4s",
    "fcvtns": "fcvtns v1.4s, v0.4s",
    "frintm": "frintm v1.4s, v0.4s",
}


def program(loops: int) -> str:
    lines = [
        "#include <stdio.h>",
        "#include <time.h>",
        "static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);"
        " return t.tv_sec + t.tv_nsec * 1e-9; }",
        "static char buf[256] __attribute__((aligned(64)));",
        "int main(void) { double t0;",
    ]
    for name, asm in INSTRUCTIONS.items():
        body = "\\n".join([asm] * 16)
        lines.append(
            f'  t0 = now(); for (long i = 0; i < {loops}L; i++) asm volatile("{body}" :: "r"(buf)'
            ' : "v0", "v1", "v2", "v3", "memory");'
        )
        lines.append(f'  printf("%-18s %7.2f\\n", "{name}", (now() - t0) * 1e9 / {loops}.0 / 16);')
    return "\n".join([*lines, "  return 0; }", ""])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--cpu", default="cortex-a76", help="QEMU's core (cortex-a72: the Pi 4, no sdot)")
    parser.add_argument("--loops", type=int, default=2_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        source, binary = Path(tmp) / "costs.c", Path(tmp) / "costs"
        source.write_text(program(args.loops))
        gcc = ["aarch64-linux-gnu-gcc", "-O2", "-march=armv8.2-a+dotprod", "-static"]
        subprocess.run([*gcc, str(source), "-o", str(binary)], check=True)
        env = os.environ | {"QEMU_CPU": args.cpu}
        run = subprocess.run(["qemu-aarch64-static", str(binary)], env=env, capture_output=True, text=True)
        if run.returncode != 0:
            print(run.stderr, file=sys.stderr)
            return run.returncode
    print(f"ns per instruction under qemu-aarch64-static as {args.cpu} (each 16 times in a loop):")
    print(run.stdout, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
