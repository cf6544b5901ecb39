# An int8 matrix multiply (256x256, int32 sums) on the target's dot-product instruction, `dot` (given by
# the lab: VNNI's vpdpbusd on x86, 16 sums of 4 uint8 x int8 products; sdot on Arm, 4 sums of 4 int8 x
# int8 products). The weights are packed so that one instruction reads one block of them:
# B[j // lanes, k // 4, j % lanes, k % 4]. sch.tensorize swaps the two innermost loops for the instruction:
# find it in the assembly's hot loop. A target without one (AVX2, plain NEON) gets `dot` None.
from tvm.script import tirx as T

LANES = dot["lanes"] if dot else 16  # noqa: F821  (dot: given by the lab)
ACTIVATIONS = dot["activations"] if dot else "uint8"  # noqa: F821


@T.prim_func(s_tir=True)
def main(
    A: T.Buffer((256, 256), ACTIVATIONS),
    B: T.Buffer((256 // LANES, 64, LANES, 4), "int8"),
    C: T.Buffer((256, 256), "int32"),
):
    for i, j, k in T.grid(256, 256, 256):
        with T.sblock("C"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = 0
            C[vi, vj] = C[vi, vj] + T.cast(A[vi, vk], "int32") * T.cast(
                B[vj // LANES, vk // 4, vj % LANES, vk % 4], "int32"
            )


def schedule(sch):
    block = sch.get_sblock("C")
    i, j, k = sch.get_loops(block)
    j_outer, j_inner = sch.split(j, [None, LANES])
    k_outer, k_inner = sch.split(k, [None, 4])
    sch.reorder(i, j_outer, k_outer, j_inner, k_inner)
    sch.parallel(i)
    if dot:  # noqa: F821
        sums = sch.cache_write(block, 0, "local")  # a tile's sums in registers, written once at its end
        sch.reverse_compute_at(sums, j_outer)
        sch.decompose_reduction(block, k_outer)
        sch.tensorize(j_inner, dot["intrinsic"])  # noqa: F821
    else:
        sch.vectorize(j_inner)
