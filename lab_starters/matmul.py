# A 1024x1024 matrix multiply in float32, C = A x B. Change the schedule below and watch the assembly and
# the time: the split factors, the loop order, which loop is vectorized and which runs in parallel.
from tvm.script import tirx as T


@T.prim_func(s_tir=True)
def main(
    A: T.Buffer((1024, 1024), "float32"),
    B: T.Buffer((1024, 1024), "float32"),
    C: T.Buffer((1024, 1024), "float32"),
):
    for i, j, k in T.grid(1024, 1024, 1024):
        with T.sblock("C"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.float32(0)
            C[vi, vj] = C[vi, vj] + A[vi, vk] * B[vk, vj]


def schedule(sch):
    i, j, k = sch.get_loops(sch.get_sblock("C"))
    i_outer, i_inner = sch.split(i, [None, 8])
    j_outer, j_inner = sch.split(j, [None, 16])
    sch.reorder(i_outer, j_outer, k, i_inner, j_inner)
    sch.vectorize(j_inner)
    sch.parallel(i_outer)
