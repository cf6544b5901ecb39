"""The device code of a GPU build: the device module's source (CUDA C, OpenCL C, Metal Shading
Language, WGSL) whole and per kernel, and for CUDA the PTX and SASS that NVIDIA's compiler tools make
of it for the target's sm_XX, with each kernel's registers, shared memory and spills as `ptxas -v`
reports them. The tools come from PyPI wheels (nvidia-cuda-nvcc, nvidia-cuda-nvdisasm) and need no
GPU. A TVM kernel `k` launches device functions named `k_kernel` (`k_kernel_1`, ... when it has more
than one launch)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from webapp.catalog import code_file
from webapp.targets import Target

if TYPE_CHECKING:
    from tvm.runtime import Module

TOOL_TIMEOUT_S = 300


def functions(source: str) -> dict[str, str]:
    """Device function name -> its text. OpenCL, Metal and WGSL sources come as one part per
    function, each headed "// Function: <name>"; CUDA C is one file of `__global__` functions."""
    out: dict[str, str] = {}
    if "// Function: " in source:
        parts = re.split(r"^// Function: (\S+)\n", source, flags=re.M)
        for name, text in zip(parts[1::2], parts[2::2], strict=True):
            out[name] = (out.get(name, "") + text).strip("\n") + "\n"
        return {name: text.removeprefix("//" + "-" * 40 + "\n") for name, text in out.items()}
    for m in re.finditer(
        r'^extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\([^;{]*\)\s*\{.*?^\}\n',
        source,
        flags=re.M | re.S,
    ):
        out[m.group(1)] = m.group(0)
    return out


def of_kernel(kernel: str, names: Iterable[str]) -> list[str]:
    """The device functions a kernel launches."""
    pattern = re.compile(rf"{re.escape(kernel)}_kernel(_\d+)?")
    return sorted(n for n in names if pattern.fullmatch(n))


# ---------------------------------------------------------------- CUDA: PTX, SASS, ptxas -v


def nvidia_tool(name: str) -> str | None:
    """An NVIDIA compiler tool from the nvidia-* wheels (nvidia/cu13/bin), else from PATH."""
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        for path in sorted(Path(root).glob(f"cu*/bin/{name}")):
            return str(path)
    return shutil.which(name)


class ToolError(Exception):
    pass


def run_tool(args: list[str], cwd: str) -> str:
    try:
        env = os.environ | {"TMPDIR": cwd}  # nvcc's own temporary files, beside ours
        done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolError(f"{Path(args[0]).name}: {exc}") from None
    if done.returncode != 0:
        raise ToolError(f"{Path(args[0]).name} failed: {done.stderr.strip()[-800:]}")
    return done.stdout + done.stderr


def cuda_binaries(source: str, sm: str) -> tuple[str, str, str]:
    """(PTX, SASS, the `ptxas -v` report) of CUDA C for `sm` ("sm_90")."""
    tools = {name: nvidia_tool(name) for name in ("nvcc", "ptxas", "nvdisasm")}
    missing = [name for name, path in tools.items() if path is None]
    if missing:
        raise ToolError(
            f"NVIDIA's {', '.join(missing)} not installed (pip install nvidia-cuda-nvcc nvidia-cuda-nvdisasm)"
        )
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "device.cu").write_text(source)
        run_tool(
            [cast(str, tools["nvcc"]), "-ptx", f"-arch={sm}", "-w", "device.cu", "-o", "device.ptx"], tmp
        )
        report = run_tool(
            [cast(str, tools["ptxas"]), "-v", f"-arch={sm}", "device.ptx", "-o", "device.cubin"], tmp
        )
        sass = run_tool([cast(str, tools["nvdisasm"]), "-c", "device.cubin"], tmp)
        return Path(tmp, "device.ptx").read_text(), sass, report


def ptx_functions(ptx: str) -> dict[str, str]:
    return {
        m.group(1): m.group(0)
        for m in re.finditer(r"^\.visible \.entry (\w+)\(.*?^\}\n", ptx, flags=re.M | re.S)
    }


def sass_functions(sass: str) -> dict[str, str]:
    parts = re.split(r"^\t\.section\t\.text\.(\w+),.*\n", sass, flags=re.M)
    return {name: text.strip("\n") + "\n" for name, text in zip(parts[1::2], parts[2::2], strict=True)}


def ptxas_resources(report: str) -> dict[str, dict]:
    """Device function -> {"registers", "shared_bytes", "stack_bytes", "spill_stores", "spill_loads"}
    from `ptxas -v`."""
    out: dict[str, dict] = {}
    name = None
    for line in report.splitlines():
        if m := re.search(r"Compiling entry function '(\w+)'", line):
            name = m.group(1)
            out.setdefault(name, {})
        elif name and (
            m := re.search(
                r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line
            )
        ):
            out[name].update(
                stack_bytes=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3))
            )
        elif name and (m := re.search(r"Used (\d+) registers", line)):
            smem = re.search(r"(\d+) bytes smem", line)
            out[name].update(registers=int(m.group(1)), shared_bytes=int(smem.group(1)) if smem else 0)
    return out


def kernel_resources(kernel: str, resources: dict[str, dict]) -> dict | None:
    """A kernel's resources over its device functions: the most registers, shared memory and stack
    any of them uses, and their spills added up."""
    rows = [resources[n] for n in of_kernel(kernel, resources) if "registers" in resources[n]]
    if not rows:
        return None
    return {
        "functions": len(rows),
        "registers": max(r["registers"] for r in rows),
        "shared_bytes": max(r["shared_bytes"] for r in rows),
        "stack_bytes": max(r.get("stack_bytes", 0) for r in rows),
        "spill_bytes": sum(r.get("spill_stores", 0) + r.get("spill_loads", 0) for r in rows),
    }


# ---------------------------------------------------------------- the inspect stage's part


def write_device_code(host: Module | None, target: Target, kernels: list[str], job_dir: Path) -> dict | None:
    """files/device.<suffix> (and for CUDA device.ptx, device.sass), views/kernels/<k>.device (.ptx,
    .sass); returns results["device_code"]: the language, the files, and per kernel its device
    functions and (CUDA) ptxas resources. None for a CPU build."""
    module = target.device_module(host) if host is not None else None
    if module is None:
        return None
    source = module.inspect_source()
    files = job_dir / "files"
    whole = f"device.{target.source_suffix}"
    (files / whole).write_text(source)
    parts = {"device": (functions(source), whole)}
    out: dict[str, Any] = {"language": target.language, "kind": target.kind, "file": whole, "kernels": {}}
    resources: dict[str, dict] = {}
    if target.binaries:
        sm = str(target.spec["arch"])
        try:
            ptx, sass, report = cuda_binaries(source, sm)
        except ToolError as exc:
            out["binaries_error"] = str(exc)
        else:
            (files / "device.ptx").write_text(ptx)
            (files / "device.sass").write_text(sass)
            (files / "ptxas.txt").write_text(report)
            parts["ptx"] = (ptx_functions(ptx), "device.ptx")
            parts["sass"] = (sass_functions(sass), "device.sass")
            resources = ptxas_resources(report)
            out.update(sm=sm, ptx="device.ptx", sass="device.sass")
    for kernel in kernels:
        entry: dict[str, Any] = {}
        for view, (funcs, _) in parts.items():
            names = of_kernel(kernel, funcs)
            (job_dir / code_file(view, kernel)).write_text("\n".join(funcs[n] for n in names))
            entry.setdefault("functions", names)
        if resources:
            entry["resources"] = kernel_resources(kernel, resources)
        out["kernels"][kernel] = entry
    out["views"] = list(parts)
    return out
