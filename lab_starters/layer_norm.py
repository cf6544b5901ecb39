# Layer normalization over the last axis of a 512x768 float32 array (a BERT-base token each row): the sum
# and the sum of squares of each row, then the normalized, scaled and shifted values.
from tvm.script import tirx as T


@T.prim_func(s_tir=True)
def main(
    X: T.Buffer((512, 768), "float32"),
    gamma: T.Buffer((768,), "float32"),
    beta: T.Buffer((768,), "float32"),
    Y: T.Buffer((512, 768), "float32"),
):
    total = T.sblock_alloc_buffer((512,), "float32")
    squares = T.sblock_alloc_buffer((512,), "float32")
    for i, k in T.grid(512, 768):
        with T.sblock("total"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                total[vi] = T.float32(0)
            total[vi] = total[vi] + X[vi, vk]
    for i, k in T.grid(512, 768):
        with T.sblock("squares"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                squares[vi] = T.float32(0)
            squares[vi] = squares[vi] + X[vi, vk] * X[vi, vk]
    for i, j in T.grid(512, 768):
        with T.sblock("Y"):
            vi, vj = T.axis.remap("SS", [i, j])
            Y[vi, vj] = (X[vi, vj] - total[vi] / T.float32(768)) * T.rsqrt(
                squares[vi] / T.float32(768) - total[vi] * total[vi] / T.float32(768 * 768) + T.float32(1e-5)
            ) * gamma[vj] + beta[vj]


def schedule(sch):
    i, j = sch.get_loops(sch.get_sblock("Y"))
    sch.compute_at(sch.get_sblock("squares"), i)
    sch.compute_at(sch.get_sblock("total"), i)
    j_outer, j_inner = sch.split(j, [None, 16])
    sch.vectorize(j_inner)
    sch.parallel(i)
