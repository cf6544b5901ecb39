"""The code panel's assembly as Compiler Explorer shows it: filtered, numbered, its hot loop marked."""

from __future__ import annotations

import json

from webapp.asm import filter_asm, hot_loop, inner_loops, loop_ops
from webapp.catalog import code_file
from webapp.codeviews import KEPT_FROM_BYTES, MODULE, clear_rendered, code_view, highlighted, prerender
from webapp.targets.arm import DIALECT as ARM
from webapp.targets.riscv import DIALECT as RISCV
from webapp.targets.x86 import DIALECT as X86

ASM = """\t.text
\t.file\t"model"
\t.globl\tk_compute_
\t.p2align\t4, 0x90
\t.type\tk_compute_,@function
k_compute_:
\t.cfi_startproc
\tpushq\t%rbp
.Ltmp0:
\tmovq\t%rdi, %rax
.LBB0_1:
\tincq\t%rcx
.LBB0_2:
\tvmovaps\t(%rdi), %zmm0
\tvfmadd231ps\t%zmm1, %zmm2, %zmm0
\tvmovaps\t%zmm0, (%rsi)
\taddq\t$64, %rdi
\tcmpq\t%rdx, %rdi
\tjne\t.LBB0_2
\taddq\t$1, %r8
\tjne\t.LBB0_1
.LBB0_3:
\tmovl\t$1, %eax
.Ltmp1:
\tmovl\t$2, %ebx
\tretq
.Lfunc_end0:
\t.size\tk_compute_, .Lfunc_end0-k_compute_
\t.cfi_endproc
"""


def test_assembly_drops_directives_and_labels_nothing_jumps_to():
    shown = filter_asm(ASM).splitlines()
    directives = (".cfi", ".p2align", ".type", ".size", ".file")
    assert not [line for line in shown if line.strip().startswith(directives)]
    assert ".Ltmp0:" not in shown and ".Lfunc_end0:" not in shown and ".LBB0_3:" not in shown
    assert ".LBB0_1:" in shown and ".LBB0_2:" in shown  # jump targets stay
    assert "k_compute_:" in shown and "\tretq" in shown


def test_hot_loop_is_the_innermost_loop_with_vector_instructions():
    shown = filter_asm(ASM)
    start, end = hot_loop(shown, X86)
    lines = shown.splitlines()
    assert lines[start - 1] == ".LBB0_2:" and lines[end - 1] == "\tjne\t.LBB0_2"
    assert hot_loop("f:\n\tmovl\t$1, %eax\n\tretq\n", X86) is None


def test_loops_and_their_arithmetic_are_read_in_each_targets_dialect():
    """A jump whose last operand is the label closes a loop on every instruction set (Arm's cbnz and
    RISC-V's bnez take a register first); each dialect counts its multiply-adds by its vectors' lanes."""
    arm = "k:\n.LBB0_1:\n\tfmla\tv1.4s, v2.4s, v3.4s\n\tsubs\tx8, x8, #1\n\tcbnz\tx8, .LBB0_1\n\tret\n"
    assert inner_loops(arm) == [(1, 4)] and hot_loop(arm, ARM) == (2, 5)
    riscv = (
        "k:\n.LBB0_1:\n\tvsetvli\ta5, s0, e32, m2, ta, ma\n\tvle32.v\tv16, (a2)\n"
        "\tvfmacc.vv\tv18, v14, v16\n\tsub\ts0, s0, a5\n\tbnez\ts0, .LBB0_1\n\tret\n"
    )
    assert inner_loops(riscv) == [(1, 6)] and hot_loop(riscv, RISCV) == (2, 7)
    # 512-bit registers in groups of 2 at 32-bit elements: 32 elements, 2 operations each
    assert loop_ops("\n".join(riscv.splitlines()[2:5]), RISCV) == 2 * 32
    x86 = "\tvfmadd231ps\t%zmm1, %zmm2, %zmm3\n\tvfmadd231ps\t%ymm1, %ymm2, %ymm3\n"
    x86 += "\tvpdpbusd\t%zmm1, %zmm2, %zmm3\n"
    assert loop_ops(x86, X86) == 2 * 16 + 2 * 8 + 8 * 16
    arm = "\tsdot\tv1.4s, v2.16b, v3.16b\n\tfmla\tv1.4s, v2.4s, v3.4s\n\tsmull\tv1.8h, v2.8b, v3.8b\n"
    assert loop_ops(arm, ARM) == 8 * 4 + 2 * 4 + 2 * 8


def test_the_marked_loop_is_the_one_the_job_found_where_its_lines_fit_the_text_and_a_linters_line_alone(
    tmp_path,
):
    path = tmp_path / code_file("asm", "k")
    path.parent.mkdir(parents=True)
    path.write_text(ASM)
    start, end = hot_loop(filter_asm(ASM), X86)
    for lines in ([1, 10**10], [3], ["1", "2"], [5, 2], None):  # the sandbox wrote them: any of these
        row = {"name": "k", "hot_loop": {"lines": lines, "by": "mca"}}
        shown = code_view(tmp_path, {"kernels": [row]}, "asm", "k")
        assert shown["hot_loop"] is None and not shown["hot_loop_by_mca"]
    row = {"name": "k", "hot_loop": {"lines": [start, end], "by": "vectors"}}
    shown = code_view(tmp_path, {"kernels": [row]}, "asm", "k")
    assert shown["hot_loop"] == (start, end) and not shown["hot_loop_by_mca"]
    shown = code_view(
        tmp_path, {"kernels": [{"name": "k", "hot_loop": {"lines": [2, 3], "by": "mca"}}]}, "asm", "k"
    )
    assert shown["hot_loop"] == (2, 3) and shown["hot_loop_by_mca"]
    # the whole text: the same loop, its lines counted among the directives
    shown = code_view(tmp_path, {"kernels": [row]}, "asm", "k", asm_all=True)
    whole = ASM.splitlines()
    assert (
        whole[shown["hot_loop"][0] - 1] == ".LBB0_2:" and whole[shown["hot_loop"][1] - 1] == "\tjne\t.LBB0_2"
    )
    shown = code_view(tmp_path, {"kernels": [{"name": "k"}]}, "asm", "k", line=4)
    assert shown["line"] == 4 and str(shown["html"]).count('class="hll"') == 1
    assert code_view(tmp_path, {"kernels": [{"name": "k"}]}, "asm", "k", line=10**6)["line"] is None


def test_a_long_kernel_view_is_highlighted_once_and_kept_a_short_one_is_not(tmp_path):
    """The worker renders a finished job's long kernel views beforehand (prerender); the web then reads
    the kept HTML instead of highlighting the text again."""
    long_asm = ASM.replace(".LBB0_2:\n", ".LBB0_2:\n" + "\tvaddps\t%zmm1, %zmm2, %zmm3\n" * 800)
    assert len(filter_asm(long_asm)) > KEPT_FROM_BYTES
    lines = filter_asm(long_asm)
    start, end = hot_loop(lines, X86)
    found = {"lines": [start, end], "by": "vectors"}
    results = {"kernels": [{"name": "k_long", "hot_loop": found}, {"name": "k_short"}]}
    (tmp_path / "result.json").write_text(json.dumps(results))
    for name, text in (("k_long", long_asm), ("k_short", ASM)):
        path = tmp_path / code_file("asm", name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert prerender(tmp_path, results) == 2  # the two kernels' assembly: the job has no other text
    kept = list((tmp_path / "rendered").glob("code-*.html"))
    assert len(kept) == 1  # the long one only
    shown = code_view(tmp_path, results, "asm", "k_long", keep=True)
    assert (
        str(shown["html"])
        == kept[0].read_text()
        == highlighted(lines, "gas", True, tuple(range(start, end + 1)))
    )
    kept[0].write_text("kept")  # read from there, not highlighted again
    assert str(code_view(tmp_path, results, "asm", "k_long", keep=True)["html"]) == "kept"
    assert "kept" not in str(code_view(tmp_path, results, "asm", "k_long", asm_all=True, keep=True)["html"])


def test_the_whole_module_shows_its_first_100_kb_and_a_kernel_up_to_400_kb(tmp_path):
    results = {"kernels": [{"name": "k"}]}
    module = "define void @k() {\n  ret void\n}\n" * 5000  # 170 KB
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "module.ll").write_text(module)
    (tmp_path / code_file("llvm", "k")).parent.mkdir(parents=True)
    (tmp_path / code_file("llvm", "k")).write_text(module)
    whole = code_view(tmp_path, results, "llvm", MODULE)
    assert whole["truncated"] and whole["shown_kb"] == 100 and whole["download"] == "module.ll"
    kernel = code_view(tmp_path, results, "llvm", "k")
    assert not kernel["truncated"] and str(kernel["html"]).count('class="line"') == module.count("\n")


def test_what_the_sandbox_left_in_rendered_is_never_shown(tmp_path):
    """The sandbox writes in the job folder, and a kernel view's kept name is a hash of its text: a
    hostile pipeline could plant a page under that name. The worker clears rendered/ when the sandbox
    ends (clear_rendered), and a running job's views are never read from there."""
    long_asm = ASM.replace(".LBB0_2:\n", ".LBB0_2:\n" + "\tvaddps\t%zmm1, %zmm2, %zmm3\n" * 800)
    results = {"kernels": [{"name": "k"}]}
    (tmp_path / code_file("asm", "k")).parent.mkdir(parents=True)
    (tmp_path / code_file("asm", "k")).write_text(long_asm)
    prerender(tmp_path, results)
    [name] = [p.name for p in (tmp_path / "rendered").glob("code-*.html")]
    (tmp_path / "rendered" / name).write_text("<script>planted</script>")
    assert "planted" not in str(code_view(tmp_path, results, "asm", "k")["html"])  # running: not read
    clear_rendered(tmp_path)
    assert not (tmp_path / "rendered").exists()
    assert "planted" not in str(code_view(tmp_path, results, "asm", "k", keep=True)["html"])
    # a link out of the folder, or a file, where the folder should be: removed, what it points to kept
    elsewhere = tmp_path.parent / f"{tmp_path.name}-elsewhere"
    elsewhere.mkdir()
    for planted in ("link", "file"):
        rendered = tmp_path / "rendered"
        clear_rendered(tmp_path)
        rendered.symlink_to(elsewhere) if planted == "link" else rendered.write_text("x")
        clear_rendered(tmp_path)
        assert not rendered.exists() and not rendered.is_symlink() and elsewhere.is_dir()
    assert not list(tmp_path.glob(".rendered*"))
