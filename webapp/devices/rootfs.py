"""The arm64 Debian root file system the emulated boards run in, built once into the data folder.

mmdebstrap's "extract" variant unpacks the packages without running anything (no root, no chroot,
no binfmt_misc: 12 s measured here), and the aarch64 wheels of the pinned TVM runtime are unzipped
into its site-packages, the compiler library left out. The finished tree is renamed
into place, so a half-built one is never used; a lock keeps two processes from building it at once.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

DEBIAN = ("bookworm", ["python3", "python3-numpy", "python3-psutil", "python3-cloudpickle", "libstdc++6"])
# The host's pins (pyproject.toml): the board's runtime must match the compiler that built the code.
WHEELS = ["apache-tvm==0.27.0.post1", "apache-tvm-ffi==0.1.14.post1", "typing_extensions==4.15.0"]
# For benchmarks/pi.py: ONNX Runtime on the same emulated board, as the peer (the host's version; it
# runs with Debian's numpy 1.24). Under qemu-aarch64 7.2 its import dies of SIGSEGV unless an arm64
# /proc/cpuinfo is bound over the host's x86 one (its cpuinfo library misreads the x86 file): the
# benchmark does that with bubblewrap.
EXTRAS = {
    "onnxruntime": (
        ["python3-protobuf", "python3-packaging", "python3-sympy", "python3-flatbuffers"],
        ["onnxruntime==1.31.1"],
    )
}
SKIP = ("libtvm_compiler.so", "libtvm_runtime_cuda.so")  # the board only runs code: ~229 MB saved
SITE = "usr/local/lib/python3.11/dist-packages"
EXCLUDE = ["/usr/share/doc/*", "/usr/share/man/*", "/usr/share/locale/*", "/usr/share/info/*"]
# Debian's BLAS alternatives are absolute symlinks, which qemu's -L prefix does not follow.
LIBRARY_PATH = "/usr/lib/aarch64-linux-gnu/blas:/usr/lib/aarch64-linux-gnu/lapack"


class RootfsError(RuntimeError):
    pass


def ready(rootfs: Path, extras: tuple[str, ...] = ()) -> bool:
    return (rootfs / ".ready").is_file() and all((rootfs / f".ready-{e}").is_file() for e in extras)


def ensure_rootfs(rootfs: Path, extras: tuple[str, ...] = (), log: Callable[[str], None] = print) -> Path:
    """The root file system at `rootfs`, built if missing (with `extras`); returns it."""
    if ready(rootfs, extras):
        return rootfs
    rootfs.parent.mkdir(parents=True, exist_ok=True)
    with open(rootfs.parent / f".{rootfs.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not ready(rootfs):
            build(rootfs, log)
        for extra in extras:
            if not ready(rootfs, (extra,)):
                debs, wheels = EXTRAS[extra]
                log(f"adding {extra} to the arm64 root file system")
                extract(debs, Path(str(rootfs) + ".extra"), "--skip=cleanup/reproducible")
                merge_tree(Path(str(rootfs) + ".extra"), rootfs)
                install_wheels(rootfs, wheels, rootfs.parent / "wheels")
                (rootfs / f".ready-{extra}").write_text("\n".join(wheels) + "\n")
    return rootfs


def extract(packages: list[str], dest: Path, *options: str) -> None:
    """Debian's arm64 packages unpacked into dest, docs and locales left out (nothing is run)."""
    excludes = [f"--dpkgopt=path-exclude={p}" for p in EXCLUDE]
    include = f"--include={','.join(packages)}"
    run(
        [
            "mmdebstrap",
            "--arch=arm64",
            "--variant=extract",
            include,
            *options,
            *excludes,
            DEBIAN[0],
            str(dest),
        ]
    )


def build(rootfs: Path, log: Callable[[str], None]) -> None:
    tmp = Path(str(rootfs) + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(rootfs, ignore_errors=True)
    suite, packages = DEBIAN
    log(f"building the arm64 root file system ({suite}: {', '.join(packages)}) in {rootfs}")
    extract(packages, tmp)
    install_wheels(tmp, WHEELS, rootfs.parent / "wheels")
    (tmp / "tmp").mkdir(exist_ok=True)
    (tmp / ".ready").write_text("\n".join(WHEELS) + "\n")
    tmp.rename(rootfs)


def install_wheels(rootfs: Path, requirements: list[str], cache: Path) -> None:
    """The aarch64 wheels of `requirements` (no dependencies), unzipped into the rootfs' Python."""
    cache.mkdir(parents=True, exist_ok=True)
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
            "--platform",
            "manylinux_2_28_aarch64",
            "--python-version",
            "3.11",
            "--implementation",
            "cp",
            "--dest",
            str(cache),
            *requirements,
        ]
    )
    site = rootfs / SITE
    site.mkdir(parents=True, exist_ok=True)
    for requirement in requirements:
        name, version = requirement.split("==")
        prefix = f"{name.replace('-', '_')}-{version}-"
        wheel = next((w for w in cache.glob("*.whl") if w.name.lower().startswith(prefix.lower())), None)
        if wheel is None:
            raise RootfsError(f"pip downloaded no aarch64 wheel for {requirement} into {cache}")
        with zipfile.ZipFile(wheel) as z:
            for member in z.infolist():
                if not member.filename.endswith(SKIP):
                    z.extract(member, site)
                    if member.external_attr >> 16 & 0o111:  # keep executables executable
                        (site / member.filename).chmod(0o755)


def merge_tree(src: Path, dest: Path) -> None:
    """Files of `src` that `dest` lacks are moved in (an extra's packages over the base rootfs)."""
    for path in sorted(src.rglob("*")):
        target = dest / path.relative_to(src)
        if path.is_dir() and not path.is_symlink():
            target.mkdir(exist_ok=True)
        elif not target.exists() and not target.is_symlink():
            path.rename(target)
    shutil.rmtree(src, ignore_errors=True)


def run(cmd: list[str]) -> None:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except FileNotFoundError:
        raise RootfsError(f"{cmd[0]} is not installed (apt-get install mmdebstrap arch-test)") from None
    except subprocess.TimeoutExpired:
        raise RootfsError(f"{cmd[0]} took more than 30 minutes") from None
    if r.returncode != 0:
        raise RootfsError(
            f"{' '.join(cmd[:3])} ... failed ({r.returncode}): {(r.stderr or r.stdout)[-1500:]}"
        )


if __name__ == "__main__":
    ensure_rootfs(Path(sys.argv[1]).resolve(), tuple(sys.argv[2:]))
