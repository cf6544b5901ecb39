# A 3x3 depthwise convolution in NHWC (112x112, 32 channels, float32), as MobileNet runs it: each channel
# has its own filter, so there is little arithmetic per byte read.
from tvm.script import tirx as T


@T.prim_func(s_tir=True)
def main(
    X: T.Buffer((1, 114, 114, 32), "float32"),  # padded by one pixel on each side
    W: T.Buffer((3, 3, 32), "float32"),
    Y: T.Buffer((1, 112, 112, 32), "float32"),
):
    for n, h, w, c, kh, kw in T.grid(1, 112, 112, 32, 3, 3):
        with T.sblock("Y"):
            vn, vh, vw, vc, vkh, vkw = T.axis.remap("SSSSRR", [n, h, w, c, kh, kw])
            with T.init():
                Y[vn, vh, vw, vc] = T.float32(0)
            Y[vn, vh, vw, vc] = Y[vn, vh, vw, vc] + X[vn, vh + vkh, vw + vkw, vc] * W[vkh, vkw, vc]


def schedule(sch):
    n, h, w, c, kh, kw = sch.get_loops(sch.get_sblock("Y"))
    c_outer, c_inner = sch.split(c, [None, 16])
    sch.reorder(n, h, w, c_outer, kh, kw, c_inner)
    sch.vectorize(c_inner)
    sch.parallel(sch.fuse(n, h))
