# A 3x3 convolution in NHWC layout (56x56, 64 channels in and out, float32), as a ResNet's middle layers
# run it. The output channels are innermost, so they vectorize; try other tile sizes.
from tvm.script import tirx as T


@T.prim_func(s_tir=True)
def main(
    X: T.Buffer((1, 58, 58, 64), "float32"),  # padded by one pixel on each side
    W: T.Buffer((3, 3, 64, 64), "float32"),  # kh, kw, in, out
    Y: T.Buffer((1, 56, 56, 64), "float32"),
):
    for n, h, w, co, kh, kw, ci in T.grid(1, 56, 56, 64, 3, 3, 64):
        with T.sblock("Y"):
            vn, vh, vw, vco, vkh, vkw, vci = T.axis.remap("SSSSRRR", [n, h, w, co, kh, kw, ci])
            with T.init():
                Y[vn, vh, vw, vco] = T.float32(0)
            Y[vn, vh, vw, vco] = Y[vn, vh, vw, vco] + X[vn, vh + vkh, vw + vkw, vci] * W[vkh, vkw, vci, vco]


def schedule(sch):
    n, h, w, co, kh, kw, ci = sch.get_loops(sch.get_sblock("Y"))
    w_outer, w_inner = sch.split(w, [None, 4])
    co_outer, co_inner = sch.split(co, [None, 16])
    sch.reorder(n, h, w_outer, co_outer, kh, kw, ci, w_inner, co_inner)
    sch.vectorize(co_inner)
    sch.unroll(w_inner)
    sch.parallel(sch.fuse(n, h))
