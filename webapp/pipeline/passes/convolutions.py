"""Convolutions TVM legalizes into kernels no schedule rule takes, rewritten as ones the rules take: two
rewrites a CPU kind makes (webapp/targets/base.py).

One-dimensional convolutions (audio front ends: wav2vec2's and HuBERT's feature encoder, their
grouped positional convolution of kernel 128, Whisper's two on the mel spectrogram; a 1-D CNN over
bytes) as two-dimensional ones of height 1 (`as_conv2d`, before channels_last, which then takes them to
NHWC as any conv2d): TVM's conv1d kernel went to the generic row-reduction schedule, 54x ONNX Runtime's
time on wav2vec2.

Transposed convolutions whose stride equals their kernel (a DB text detector's 2x2 stride-2
upsampling of its probability map, U-Nets' and FPNs' learned upsampling: `upsampling`, after
channels_last). Each input pixel writes its own KH x KW block of outputs, no two blocks overlap, so the
layer is one GEMM over the input channels and an interleave:

    Y[n, h, w, (i, j, co)] = sum_ci X[n, h, w, ci] W[ci, (i, j, co)]     the input in NHWC rows
    out[n, co, h*KH + i, w*KW + j] = Y[n, h, w, i, j, co]                  (reshape and transpose)

where TVM's legalization (topi.nn.conv2d_transpose_nchw) dilates the input with zeros and runs a direct
convolution over it: KH x KW times the multiply-adds, in a kernel no schedule rule takes. The GEMM
reads its input in NHWC: channels_last leaves the transposed convolution in NCHW behind a transpose of
the NHWC activations, and the transposes on either side of the rewritten layer cancel (Transposes): a
transpose of a transpose is one transpose, or none.

Convolutions whose output channels are no multiple of 4 (an STFT's 258 = 2 x 129 frequency bins in a
voice activity detector, a detection head's 18 classes): the conv2d rules put output channels in
vectors of 16, 8 or 4 that divide them, and with none such the kernel fell to a scalar rule (Silero
VAD's STFT: 2 GFLOP/s, three quarters of its run). `channels` pads the weights with zero filters to
a multiple of 16 (of 4 under 64 channels) and slices the output back (after channels_last, in either
layout).
"""

from __future__ import annotations

import tvm
from tvm import relax

from webapp.pipeline.passes.rewrites import mutate_functions, static_shape

PERMUTE = tvm.ir.Op.get("relax.permute_dims")


def takes(call: relax.Call) -> bool:
    """A float conv2d_transpose in NCHW / IOHW, of one group, stride = kernel, no padding, no output
    padding, no dilation, its shapes known."""
    attrs, data = call.attrs, call.args[0].ty
    weight = static_shape(call.args[1].ty)
    if static_shape(data) is None or weight is None or str(data.dtype) != "float32":
        return False
    return (
        str(attrs.data_layout) == "NCHW"
        and str(attrs.kernel_layout) == "IOHW"
        and str(attrs.out_layout or "NCHW") == "NCHW"
        and str(attrs.out_dtype or "float32") in ("float32", "")
        and int(attrs.groups) == 1
        and [int(v) for v in attrs.strides] == weight[2:]
        and all(int(v) == 0 for v in [*attrs.padding, *attrs.output_padding])
        and all(int(v) == 1 for v in attrs.dilation)
    )


@relax.expr_functor.mutator
class Transposes(relax.PyExprMutator):
    """Transposed convolutions this rewrite takes as GEMMs; then, in the same walk, a transpose of a
    transpose as one (or none: the identity)."""

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not isinstance(call.op, tvm.ir.Op):
            return call
        if call.op.name == "relax.nn.conv2d_transpose" and takes(call):
            return self.as_gemm(call)
        if call.op.name == "relax.permute_dims" and call.attrs.axes is not None:
            return self.transpose(call.args[0], [int(a) for a in call.attrs.axes])
        return call

    def transpose(self, x: relax.Expr, axes: list[int]) -> relax.Expr:
        """permute_dims(x, axes), x's own transpose (if it is one) folded in."""
        bound = self.lookup_binding(x) if isinstance(x, relax.Var) else None
        if isinstance(bound, relax.Call) and bound.op.same_as(PERMUTE) and bound.attrs.axes is not None:
            first = [int(a) for a in bound.attrs.axes]
            x, axes = bound.args[0], [first[a] for a in axes]
        return x if axes == list(range(len(axes))) else relax.op.permute_dims(x, axes)

    def as_gemm(self, call: relax.Call) -> relax.Expr:
        """The transposed convolution `call` (one that `takes`) as a GEMM and an interleave."""
        x, w = call.args
        n, _, h, wd = (int(d) for d in x.ty.shape.values)
        ci, co, kh, kw = (int(d) for d in w.ty.shape.values)
        op, emit = relax.op, self.builder_.emit
        rows = emit(self.transpose(x, [0, 2, 3, 1]))
        columns = emit(op.reshape(emit(op.permute_dims(w, [0, 2, 3, 1])), [ci, kh * kw * co]))
        y = emit(op.reshape(emit(op.matmul(rows, columns)), [n, h, wd, kh, kw, co]))
        nhwc = emit(op.reshape(emit(op.permute_dims(y, [0, 1, 3, 2, 4, 5])), [n, h * kh, wd * kw, co]))
        return op.permute_dims(nhwc, [0, 3, 1, 2])


@relax.expr_functor.mutator
class OneD(relax.PyExprMutator):
    """Float conv1d calls in NCW / OIW as conv2d of height 1 between an expand_dims and a squeeze."""

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.nn.conv1d"):
            return call
        attrs, emit = call.attrs, self.builder_.emit
        layouts = (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout or "NCW"))
        if layouts != ("NCW", "OIW", "NCW") or str(call.args[0].ty.dtype) != "float32":
            return call
        left, right = (int(v) for v in attrs.padding)
        conv = relax.op.nn.conv2d(
            emit(relax.op.expand_dims(call.args[0], [2])),
            emit(relax.op.expand_dims(call.args[1], [2])),
            strides=(1, int(attrs.strides[0])),
            padding=(0, left, 0, right),
            dilation=(1, int(attrs.dilation[0])),
            groups=int(attrs.groups),
            out_dtype=attrs.out_dtype,
        )
        return relax.op.squeeze(emit(conv), [2])


CHANNELS = 16  # the widest float32 vector of the CPU kinds (AVX-512); under 64 channels, a multiple of 4


def padded_channels(channels: int) -> int:
    """The output channels a conv2d of `channels` computes: a multiple of a vector the rules take."""
    if channels % 4 == 0 or channels < 8:
        return channels
    step = CHANNELS if channels >= 64 else 4
    return -(-channels // step) * step


@relax.expr_functor.mutator
class Channels(relax.PyExprMutator):
    """Float conv2d calls (NCHW / OIHW or NHWC / HWIO, one group) over padded output channels, the
    output sliced back."""

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.nn.conv2d"):
            return call
        attrs, (x, w) = call.attrs, call.args
        layouts = (
            str(attrs.data_layout),
            str(attrs.kernel_layout),
            str(attrs.out_layout or attrs.data_layout),
        )
        weight = static_shape(w.ty)
        if layouts not in (("NCHW", "OIHW", "NCHW"), ("NHWC", "HWIO", "NHWC")) or weight is None:
            return call
        if int(attrs.groups) != 1 or str(x.ty.dtype) != "float32" or static_shape(call.ty) is None:
            return call
        axis = layouts[1].index("O")
        channels = weight[axis]
        extra = padded_channels(channels) - channels
        if extra == 0:
            return call
        width = [0] * 8
        width[2 * axis + 1] = extra
        padded = self.builder_.emit(relax.op.nn.pad(w, width))
        conv = self.builder_.emit(relax.Call(call.op, [x, padded], attrs))
        out_axis = layouts[2].index("C")
        return relax.op.strided_slice(conv, axes=[out_axis], begin=[0], end=[channels])


@tvm.transform.module_pass(opt_level=0, name="PlaygroundConv1dAsConv2d")
def as_conv2d(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """The conv1d rewrite (OneD) on every Relax function; the module as it was if it fails."""
    return mutate_functions(OneD, mod)


@tvm.transform.module_pass(opt_level=0, name="PlaygroundUpsampling")
def upsampling(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """The transposed convolutions' rewrite (Transposes) on every Relax function; the module as it was
    if it fails."""
    return mutate_functions(Transposes, mod)


@tvm.transform.module_pass(opt_level=0, name="PlaygroundPaddedChannels")
def channels(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """The output channels' rewrite (Channels) on every Relax function; the module as it was if it
    fails."""
    return mutate_functions(Channels, mod)
