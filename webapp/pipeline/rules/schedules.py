"""Default schedules: each kernel scheduled by the first rule of its target's family that fits (the CPU
float and int8 rules, or the GPU rules: FAMILIES, which a target names), labelled with that rule; the
design spaces tuning searches; the weight repacking split into kernels of their own."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

import tvm
import tvm_ffi
from tvm import relax, s_tir, tirx

from webapp.pipeline.rules import gpu as gpu_rules
from webapp.pipeline.rules.common import PREPROC, has_reduction, serial_kernel, small, space_choices
from webapp.pipeline.rules.cpu import conv2d, conv2d_nhwc, matmul, winograd
from webapp.pipeline.rules.elementwise import elementwise
from webapp.pipeline.rules.int8 import conv2d_int8, conv2d_nhwc_int8, matmul_int8
from webapp.pipeline.rules.reductions import columns, reduction, rows
from webapp.targets import Target

SCHEDULE_ATTR = "playground.schedule"
TVM_KERNEL = "TVM's own kernel"  # the label of a kernel TVM scheduled itself (its GPU sort and scan)

# The rule families, by the name a target gives (Target.rule_family): each in the order it is tried.
FAMILIES = {
    "cpu": (
        conv2d_nhwc_int8,
        conv2d_int8,
        matmul_int8,
        winograd,
        conv2d_nhwc,
        conv2d,
        matmul,
        rows,
        columns,
        reduction,
        elementwise,
    ),
    "gpu": gpu_rules.RULES,
}


# The choices a tuning design space fixes, per rule; MetaSchedule samples the register tile's other
# side inside each (inner_split). The default rule is one point of these spaces.
SPACES = {
    conv2d_nhwc_int8: [{"vectors": v, "channels_outer": o} for v in (1, 2, 4) for o in (False, True)],
    matmul_int8: [{"vectors": v} for v in (1, 2, 4)],
}


def design_spaces(sch: s_tir.Schedule, target: Target) -> list[s_tir.Schedule]:
    """MetaSchedule's design spaces for a kernel that a rule of SPACES schedules (the int8 kernels, on
    the target's dot-product instruction, which MetaSchedule's own rules do not use): one copy of
    `sch` per choice the rule takes, []  when no such rule fits (webapp.pipeline.stages.tune)."""
    serial = serial_kernel.set(small(sch))
    try:
        for rule, choices in SPACES.items():
            spaces = [space for chosen in choices if (space := in_space(sch, target, rule, chosen))]
            if spaces:
                return spaces
        return []
    finally:
        serial_kernel.reset(serial)


def in_space(
    sch: s_tir.Schedule, target: Target, rule: Callable[..., Any], chosen: dict
) -> s_tir.Schedule | None:
    """A copy of `sch` scheduled by `rule` with the choices `chosen`; None when it does not fit."""
    space, copy = space_choices.set(chosen), sch.copy()
    try:
        return copy if rule(copy, target) is not None else None
    except Exception:  # a choice TVM refuses is left out of the spaces
        return None
    finally:
        space_choices.reset(space)


def failure(rule: Callable[..., Any], error: Exception) -> str:
    """What a rule's failure on a kernel looks like in its label: the rule and the error's first line."""
    kind, lines = type(error).__name__, str(error).strip().splitlines()
    reason = kind if not lines else lines[0] if lines[0].startswith(kind) else f"{kind}: {lines[0]}"
    return f"{rule.__name__} rule failed: {reason[:100]}"


# Kernels scheduled in this process, by their TIR (structurally, and by name), target and the rules
# that scheduled them (a test may swap the family's rules): a job builds
# its float and quantized models, and the models its quantizer runs (every layer's result exposed),
# from many of the same kernels (ddddocr's recognizer: four builds, 61 to ~270 kernels each).
SCHEDULED: OrderedDict[tuple, tirx.PrimFunc] = OrderedDict()
SCHEDULED_MAX = 4096


def schedule_kernel(func: tirx.PrimFunc, target: Target) -> tirx.PrimFunc:
    """schedule_one, or its result for the same kernel and target scheduled before (SCHEDULED)."""
    # its buffers' names too, which structural equality leaves aside: a kernel's code views show them
    names = tuple(str(getattr(p, "name", "")) for p in func.params)
    structural = tvm_ffi.StructuralKey(func)  # type: ignore[call-arg]  # its stub asks for the hash it computes
    key = (structural, names, target.name, str(target.tvm), FAMILIES[target.rule_family])
    if key in SCHEDULED:
        SCHEDULED.move_to_end(key)
        return SCHEDULED[key]
    scheduled = SCHEDULED[key] = schedule_one(func, target)
    if len(SCHEDULED) > SCHEDULED_MAX:
        SCHEDULED.popitem(last=False)
    return scheduled


def schedule_one(func: tirx.PrimFunc, target: Target) -> tirx.PrimFunc:
    """The kernel scheduled by the first rule of the target's family that fits, labelled; unchanged
    (labelled naive) when none does. A rule that raises, whatever the error (TVM refusing its
    schedule, or a bug of the rule's own), leaves the kernel to the next rule, and the label says so,
    e.g. "default rule: elementwise (matmul rule failed: IndexError: ...)": it never fails the build.
    A kernel TVM bound to GPU threads itself (its sort, scan) keeps TVM's schedule."""
    if gpu_rules.bound_already(func):
        return func.with_attrs({"tirx.is_scheduled": True, SCHEDULE_ATTR: TVM_KERNEL})
    try:
        probe = s_tir.Schedule(func)
        probe.get_sblock("root")
    except Exception:  # an opaque kernel (cumsum, sort, scatter: loops inside one block): no rule fits
        return func.with_attr(SCHEDULE_ATTR, "naive")
    rules = FAMILIES[target.rule_family]
    if elementwise in rules and not has_reduction(probe):
        rules = (elementwise,)  # no reduction: the one rule that fits (the others tried first, each
        # on a schedule of its own: ~30 ms a kernel, on ddddocr's hundreds of LSTM-step kernels)
    serial = serial_kernel.set(small(probe))
    try:
        return first_rule(func, target, rules)
    finally:
        serial_kernel.reset(serial)


def first_rule(func: tirx.PrimFunc, target: Target, rules: Iterable[Callable[..., Any]]) -> tirx.PrimFunc:
    failures = []
    for rule in rules:
        try:
            sch = s_tir.Schedule(func)
            result = rule(sch, target)
        except Exception as e:  # any failure of one rule leaves the kernel to the next
            failures.append(failure(rule, e))
            continue
        if result is None:
            continue
        sch, label = result if isinstance(result, tuple) else (sch, result)
        return sch.mod["main"].with_attrs(
            {"tirx.is_scheduled": True, SCHEDULE_ATTR: with_failures(label, failures)}
        )
    return func.with_attr(SCHEDULE_ATTR, with_failures("naive", failures))


def with_failures(label: str, failures: list[str]) -> str:
    return f"{label} ({'; '.join(failures)})" if failures else label


def is_scheduled(func: tvm.ir.BaseFunc) -> bool:
    return bool(func.attrs and func.attrs.get("tirx.is_scheduled"))


def default_schedules(mod: tvm.IRModule, target: Target) -> tvm.IRModule:
    """Schedules every kernel not scheduled yet (tuned kernels keep their schedule)."""
    updates = {
        gv: schedule_kernel(func, target)
        for gv, func in mod.functions_items()
        if isinstance(func, tirx.PrimFunc) and not is_scheduled(func)
    }
    mod = mod.clone()  # the caller's module stays as it was
    for gv, func in updates.items():
        mod[gv] = func
    return mod


def repacks_weights(func: tvm.ir.BaseFunc) -> bool:
    """Whether a kernel has weight repacking blocks (marked PREPROC by a rule, or by a tuning
    record's layout rewrite) for SplitLayoutRewritePreproc to move into a kernel of their own."""
    if not isinstance(func, tirx.PrimFunc):
        return False
    try:
        sch = s_tir.Schedule(func)
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
    except Exception:  # a kernel TVM cannot schedule has no such blocks
        return False
    return any(PREPROC in sch.get(b).annotations for b in blocks)


PREPACK = "_weight_prepack"  # a kernel's weight repacking, split off by split_weight_repacking
PREPACKS_ATTR = (
    "playground.prepacks"  # the lowered module's {kernel: its repacking's PrimFunc}, for reproducers
)


def split_weight_repacking(mod: tvm.IRModule) -> tvm.IRModule:
    """The weight repacking blocks of the kernels that have them moved into kernels of their own
    (`<name>_weight_prepack`), called before their kernel, which keeps its name (TVM's pass renames
    it `<name>_prepacked`; the graph, the tuning table and the kernel list then disagree). TVM's
    pass checks the form of every kernel and fails on some with no repacking at all (an opaque
    block, as a cumsum's), so it sees only the kernels that repack."""
    repacking = {gv for gv, f in mod.functions_items() if repacks_weights(f)}
    if not repacking:
        return mod
    others = [gv for gv, f in mod.functions_items() if isinstance(f, tirx.PrimFunc) and gv not in repacking]
    split = mod.clone()
    for gv in others:
        del split[gv]
    split = relax.transform.SplitLayoutRewritePreproc()(split)
    prepacked = [gv for gv in split.get_global_vars() if gv.name_hint.endswith("_prepacked")]
    out = split.clone()
    left = {gv.name_hint for gv in split.get_global_vars()}
    for gv in [*prepacked, *repacking]:  # the kernels as they were are no longer called
        if gv.name_hint in left:
            del out[gv.name_hint]
    bb = relax.BlockBuilder(out)
    renamed = {gv: bb.add_func(split[gv], gv.name_hint.removesuffix("_prepacked")) for gv in prepacked}
    for gv in others:
        bb.update_func(gv, mod[gv])
    for gv, func in split.functions_items():
        if isinstance(func, relax.Function):
            bb.update_func(gv, rename_calls(func, renamed))
    return bb.get()


def prepacks_by_kernel(mod: tvm.IRModule) -> dict[str, tirx.PrimFunc]:
    """Each kernel's weight repacking ({kernel: the repacking's PrimFunc}), from the calls: kernels whose
    weights are alike share one repacking function, named after one of them."""
    made: dict = {}  # the var a repacking's call binds -> that repacking
    out: dict[str, tirx.PrimFunc] = {}
    for func in (f for _, f in mod.functions_items() if isinstance(f, relax.Function)):
        for block in getattr(func.body, "blocks", []):
            for binding in block.bindings:
                call = binding.value
                if not (
                    isinstance(call, relax.Call)
                    and len(call.args) >= 2
                    and isinstance(call.args[0], tvm.ir.GlobalVar)
                ):
                    continue
                callee = call.args[0].name_hint
                if callee.endswith(PREPACK):
                    made[binding.var] = mod[callee]
                    continue
                args = call.args[1].fields if isinstance(call.args[1], relax.Tuple) else []
                repack = next((made[a] for a in args if a in made), None)
                if repack is not None:
                    out[callee] = repack
    return out


def rename_calls(func: relax.Function, renamed: dict) -> relax.Function:
    """The function calling the kernels `renamed` maps by their new GlobalVars."""

    @relax.expr_functor.mutator
    class Rename(relax.PyExprMutator):
        def visit_global_var_(self, gv):
            return renamed.get(gv, gv)

    return Rename().visit_expr(func)


def labels(mod: tvm.IRModule) -> dict[str, str]:
    """Kernel name -> how it was scheduled ("tuned", "default rule: ...", "naive")."""
    return {
        gv.name_hint: str(func.attrs.get(SCHEDULE_ATTR, TVM_KERNEL if is_scheduled(func) else "naive"))
        if func.attrs
        else "naive"
        for gv, func in mod.functions_items()
        if isinstance(func, tirx.PrimFunc)
    }
