"""What a timing ran on and beside: the CPU (its model, the instruction sets its int8 and float code
use, the frequency governor where readable) and how busy the machine was meanwhile: from /proc/stat
(system-wide even in the sandbox), the CPU time of every other process (all cores' busy time less
this process's own) and the time the hypervisor stole."""

from __future__ import annotations

import os
import time
from pathlib import Path

from webapp.targets.base import cpu_flags

# /proc/cpuinfo's flag names (x86 "flags", Arm "Features") -> how the page names them, in this order
INSTRUCTION_SETS = {
    "avx2": "AVX2",
    "avx512f": "AVX-512",
    "avx512_vnni": "AVX-512 VNNI",
    "avx_vnni": "AVX-VNNI",
    "asimd": "NEON",
    "asimddp": "dot product (sdot)",
    "i8mm": "i8mm (smmla)",
}
# a timing is disturbed when other processes used more than this many cores on average, or the
# hypervisor stole more than this share of the CPU time
BUSY_CORES = 0.25
STEAL_SHARE = 0.05


def machine() -> dict:
    """The CPU this ran on: model name, instruction sets, cores, frequency governor (None where the
    machine does not say)."""
    model = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = (part.strip() for part in line.partition(":"))
            if key in ("model name", "Hardware"):
                model = value
                break
    except OSError:
        pass
    flags = cpu_flags()
    try:
        governor = Path("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor").read_text().strip()
    except OSError:
        governor = None
    return {
        "cpu": model,
        "instruction_sets": [name for flag, name in INSTRUCTION_SETS.items() if flag in flags],
        "cores": os.cpu_count(),
        "governor": governor,
    }


def cpu_seconds() -> tuple[float, float] | None:
    """(all cores' busy seconds, stolen seconds) since boot, from /proc/stat; None where unreadable."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    tick = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq) / tick, steal / tick


class Watch:
    """`with Watch() as w: ...`, then w.conditions(): how busy the machine was meanwhile."""

    def __enter__(self) -> Watch:
        self.started, self.own, self.cpu = time.monotonic(), time.process_time(), cpu_seconds()
        return self

    def __exit__(self, *exc) -> None:
        self.wall = time.monotonic() - self.started
        self.own = time.process_time() - self.own
        after = cpu_seconds()
        self.cpu = (
            None if after is None or self.cpu is None else (after[0] - self.cpu[0], after[1] - self.cpu[1])
        )

    def conditions(self) -> dict:
        """{"quiet", "others_cores", "steal_share", "seconds", "what"}: others_cores, the other processes'
        CPU use in cores on average; steal_share, the stolen share of the machine's CPU time."""
        if self.cpu is None or self.wall <= 0:
            return {"quiet": None, "others_cores": None, "steal_share": None, "seconds": self.wall,
                    "what": "not measured (/proc/stat unreadable)"}  # fmt: skip
        busy, stolen = self.cpu
        others = max(0.0, (busy - self.own) / self.wall)
        steal = stolen / (self.wall * (os.cpu_count() or 1))
        quiet = others <= BUSY_CORES and steal <= STEAL_SHARE
        what = [f"other processes used {others:.2f} cores on average"] if others > BUSY_CORES else []
        what += [f"the hypervisor stole {steal:.0%} of the CPU time"] if steal > STEAL_SHARE else []
        return {
            "quiet": quiet,
            "others_cores": round(others, 3),
            "steal_share": round(steal, 4),
            "seconds": round(self.wall, 2),
            "what": "quiet" if quiet else "; ".join(what),
        }
