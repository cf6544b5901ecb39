# Softmax over the last axis of a 256x1024 float32 array, in three blocks: each row's maximum, the sum of
# the exponentials, then the division. Try compute_at to keep a row's work together.
from tvm.script import tirx as T


@T.prim_func(s_tir=True)
def main(X: T.Buffer((256, 1024), "float32"), Y: T.Buffer((256, 1024), "float32")):
    row_max = T.sblock_alloc_buffer((256,), "float32")
    row_sum = T.sblock_alloc_buffer((256,), "float32")
    for i, k in T.grid(256, 1024):
        with T.sblock("row_max"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                row_max[vi] = T.float32(-3.4e38)
            row_max[vi] = T.max(row_max[vi], X[vi, vk])
    for i, k in T.grid(256, 1024):
        with T.sblock("row_sum"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                row_sum[vi] = T.float32(0)
            row_sum[vi] = row_sum[vi] + T.exp(X[vi, vk] - row_max[vi])
    for i, j in T.grid(256, 1024):
        with T.sblock("Y"):
            vi, vj = T.axis.remap("SS", [i, j])
            Y[vi, vj] = T.exp(X[vi, vj] - row_max[vi]) / row_sum[vi]


def schedule(sch):
    i, j = sch.get_loops(sch.get_sblock("Y"))
    sch.compute_at(sch.get_sblock("row_sum"), i)
    sch.compute_at(sch.get_sblock("row_max"), i)  # i: the loop of Y that row_sum now sits in too
    j_outer, j_inner = sch.split(j, [None, 16])
    sch.vectorize(j_inner)
    sch.parallel(i)
