"""The structure the code keeps (docs/architecture.md): what only a target answers, and how long a
pipeline function may be. Read from the source, as the import contracts are (pyproject.toml)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LONGEST = 60  # lines, a function of the pipeline's, its docstring included


def modules(folder: str):
    """(path, its path from the repository's root) of each Python module under `folder`."""
    for path in sorted((ROOT / folder).rglob("*.py")):
        yield path, path.relative_to(ROOT).as_posix()


# What a target answers for itself (webapp/targets): no module elsewhere asks which kind it is
KIND_TESTS = {"gpu", "board", "can_run_here", "arch", "clock_ghz"}
ARCH_NAMES = {"aarch64", "x86_64", "riscv64", "cuda", "opencl", "metal", "webgpu"}
# the device pool's emulation (QEMU for aarch64, its wheels) and the reproducer's standalone script
OUTSIDE_THE_RULE = {"webapp/devices/rootfs.py", "webapp/devices/board.py", "webapp/exports/repro_script.py"}


def test_no_module_outside_targets_tests_a_targets_kind_or_architecture():
    """Callers ask a target its answers (where it is timed, why it is not tuned, its llvm-mca CPU, its
    assembly's dialect...), never `.gpu`, `.board` or an architecture's name."""
    found = []
    for path, rel in modules("webapp"):
        if rel.startswith("webapp/targets/") or rel in OUTSIDE_THE_RULE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in KIND_TESTS:
                if not (
                    isinstance(node.value, ast.Name) and node.value.id == "dlight"
                ):  # dlight.gpu: a module
                    found.append(f"{rel}:{node.lineno} .{node.attr}")
            if isinstance(node, ast.Compare):
                names = [
                    n.value
                    for n in ast.walk(node)
                    if isinstance(n, ast.Constant) and isinstance(n.value, str)
                ]
                found += [f"{rel}:{node.lineno} '{n}'" for n in names if any(a in n for a in ARCH_NAMES)]
    assert not found, found


def test_no_pipeline_function_is_longer_than_60_lines():
    long = [
        f"{rel}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path, rel in modules("webapp/pipeline")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > LONGEST
    ]
    assert not long, long


def public_functions(tree: ast.Module):
    """The module's public functions and its public classes' public methods (a name without a leading
    underscore; a function nested in another is not public)."""
    scopes: list[ast.AST] = [tree]
    while scopes:
        scope = scopes.pop()
        for node in ast.iter_child_nodes(scope):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                scopes.append(node)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not node.name.startswith("_"):
                yield node


def test_every_public_function_is_typed():
    """mypy (make test) checks the bodies of typed functions only: every public function of webapp/
    annotates its parameters (self and cls aside) and its return."""
    untyped = []
    for path, rel in modules("webapp"):
        for fn in public_functions(ast.parse(path.read_text())):
            a = fn.args
            params = [p for p in a.posonlyargs + a.args + a.kwonlyargs if p.arg not in ("self", "cls")]
            params += [p for p in (a.vararg, a.kwarg) if p is not None]
            if any(p.annotation is None for p in params) or fn.returns is None:
                untyped.append(f"{rel}:{fn.lineno} {fn.name}")
    assert not untyped, f"{len(untyped)} public functions not typed:\n" + "\n".join(untyped)
