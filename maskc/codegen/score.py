"""The score modifier as CUDA device code: ``ScoreMod`` (resolve) → :class:`~maskc.kernel_ir.ScoreCode`.

The kernels keep scores in raw units, ``s = q_vec . k_vec``, and fold the softmax scale into the exponent
(``exp2(s * scale_log2 - m * scale_log2)``). A modifier ``mod`` acts on the scaled score ``x = scale * s``, so the
kernels replace ``s`` by ``mod(scale * s) / scale`` and everything after (row maxima, exponent, LSE) stays as
it is. The generated code computes that in as few per-element instructions as the expression allows: every
part that reads neither q, k nor the score is hoisted into ``ScoreHead`` (computed once per work item), and
the factors ``scale`` and ``1 / scale`` are folded into those hoisted constants wherever the expression is
linear in the score (``score - slope * (q - k)`` is one FMA on s: ``fmaf(-slope / scale, (float)(q - k), s)``;
``softcap(score, cap)`` is two multiplies around one ``tanh.approx.f32``, and one in the forward, whose softmax
scale takes the other: score_unit). The derivative the backward needs,
``d mod(scale * s) / scale / ds = mod'(x)``, is propagated alongside (forward mode) and folds to nothing when
it is 1 (additive modifiers: ALiBi, bias tables)::

    struct ScoreHead { float f0, ...; };     // hoisted per (mask batch element, head)
    ScoreHead score_head(const int* mask, int b, int h, float scale);
    float score_mod(const ScoreHead& c, const int* mask, float s, int q, int k);        // raw units in, out
    float score_mod_grad(const ScoreHead& c, const int* mask, float s, int q, int k, float& d);   // d = mod'(x)

``mask`` is the kernel's ``mask_data + mask_offsets[b]``: float parameters travel in it as their bits
(:func:`maskc.codegen.predicate.pack_mask_data`). A sub-block's kernels (``offsets``) read its origin from the
head of the table and pass local positions, as the predicate's do.
"""
from __future__ import annotations

from maskc import ir
from maskc.codegen.cwriter import TableLayout
from maskc.codegen.sanitize import comment_text
from maskc.codegen.score_writer import ONE, ScoreWriter, is_score, top_chain, top_softcap
from maskc.kernel_ir import ScoreCode

_HELPERS = """\
// tanh on the SFU (tanh.approx.f32: sm_75+, max relative error 2^-10.99), as FlashAttention-3 soft-caps.
__device__ __forceinline__ float maskc_tanh(float x) {
    float y;
    asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
"""
_FLOAT_AT = """\
// Entry i of a float table [n, bits_0 .. bits_n-1], i clamped into [0, n).
__device__ __forceinline__ float maskc_float_at(const int* __restrict__ table, int i) {
    return __int_as_float(table[1 + min(max(i, 0), table[0] - 1)]);
}
"""


def _describe(e) -> str:
    if isinstance(e, ir.ScoreIn):
        return "score"
    if isinstance(e, ir.FloatConst):
        return repr(e.value)
    if isinstance(e, ir.FloatParam):
        return e.name
    if isinstance(e, ir.FloatAt):
        from maskc.analysis.forms import render
        from maskc.analysis.linear import from_expr
        return f"{e.table}[{render(from_expr(e.index))}]"
    if isinstance(e, ir.ToFloat):
        from maskc.analysis.forms import render
        from maskc.analysis.linear import from_expr
        text = render(from_expr(e.value))
        return f"({text})" if " " in text else text
    if isinstance(e, ir.FArith):
        return f"({_describe(e.left)} {e.op} {_describe(e.right)})"
    return f"{e.fn}({', '.join(_describe(a) for a in e.args)})"


def describe(mod: ir.ScoreMod) -> str:
    """The modifier in one line (for kernel headers and ``maskc explain``)."""
    text = _describe(mod.expr)
    return "score = " + (text[1:-1] if text.startswith("(") and text.endswith(")") else text)


def score_code(mask: ir.ResolvedMask, constants: tuple[tuple[str, int], ...] = (),
               offsets: bool = False) -> ScoreCode | None:
    """The device code of ``mask``'s score modifier (see the module docstring), or None when it has none."""
    if mask.score is None:
        return None
    w = ScoreWriter(TableLayout.of(mask.params), dict(constants))
    value, unit, grad = w.score(mask.score.expr) if is_score(mask.score.expr) else (
        w.local(w.natural(mask.score.expr)), "nat", None)
    result = w.to(value, unit, "raw")
    lines, grad_lines = w.lines, w.grad_lines
    # the forward's variant, where the top chain adds terms that read no key position (ALiBi's slope * q), or
    # where the whole modifier is softcap(...), whose factor cap / scale moves into the softmax's scale
    w.lines, w.grad_lines, w._memo, w.forward, w.top = [], [], {}, True, top_chain(mask.score.expr)
    w.top_softcap = top_softcap(mask.score.expr)
    forward_result = (w.to(*w.score(mask.score.expr)[:2], "raw") if w.top or w.top_softcap is not None
                      else None)
    forward_lines, row_terms, unit_field = w.lines, w.row_terms, w.unit
    out = [f"// The score modifier: {comment_text(describe(mask.score))}",
           "// (applied to a visible pair's scaled score x = scale * s before the softmax; the kernels keep raw s,",
           "// so score_mod returns mod(scale * s) / scale, and score_mod_grad also d = mod'(x))",
           "// q, k: the pair's positions; qf, kf: the same as floats (exact below 2**24), which the caller derives from",
           "// a row's and a tile's first position by adding constants, so that (q - k) costs one add, not a conversion",
           _FLOAT_AT.rstrip("\n"), "struct ScoreHead {", "    float scale, inv_scale;" + (" float q0, k0;" if offsets else "")]
    out += [f"    float f{i};" for i in range(len(w.fields))]
    out += ["};", ""]
    table = "table" if offsets else "mask"
    out += [f"__device__ __forceinline__ ScoreHead score_head(const int* __restrict__ {table}, int b, int h, "
            "float scale) {"]
    if offsets:
        out.append("    const int* __restrict__ mask = table + 2;")
    out += ["    ScoreHead c;", "    (void)mask; (void)b; (void)h;", "    c.scale = scale;", "    c.inv_scale = 1.f / scale;"]
    if offsets:
        out += ["    c.q0 = (float)table[0];", "    c.k0 = (float)table[1];"]
    out += ["    const float inv_scale = c.inv_scale;", "    (void)inv_scale;"]
    out += [f"    c.f{i} = {code};" for i, code in enumerate(w.fields)]
    out += ["    return c;", "}", ""]
    position = "q_local, int k_local, float qf_local, float kf_local" if offsets else "q, int k, float qf, float kf"
    unpack = ["    const int* __restrict__ mask = table + 2;",
              "    const int q = q_local + table[0], k = k_local + table[1];",
              "    const float qf = qf_local + c.q0, kf = kf_local + c.k0;"] if offsets else []
    for with_grad in (False, True):
        name, extra = ("score_mod_grad", ", float& d") if with_grad else ("score_mod", "")
        out.append(f"__device__ __forceinline__ float {name}(const ScoreHead& c, const int* __restrict__ {table}, "
                   f"float s, int {position}{extra}) {{")
        out += unpack + ["    (void)mask; (void)q; (void)k; (void)qf; (void)kf; (void)s;"]
        out += _in_order(lines + (grad_lines if with_grad else []))
        if with_grad:
            out.append(f"    d = {'0.f' if grad is None else grad};")
        out += [f"    return {result};", "}", ""]
    if row_terms or unit_field:
        out += ["// The forward's scores: score_mod less its terms that read no key position (the softmax of a row is",
                "// unchanged by them: score_row gives them back to the LSE), divided by its positive factor",
                "// score_unit (by which the forward multiplies the softmax's scale instead). kfo: the key's position",
                "// less the row's origin (any position of the row's work item, the same for all its keys), exact and",
                "// small near the diagonal.",
                f"__device__ __forceinline__ float score_mod_fwd(const ScoreHead& c, const int* __restrict__ {table}, "
                f"float s, int {position}, float kfo) {{"]
        out += unpack + ["    (void)mask; (void)q; (void)k; (void)qf; (void)kf; (void)s; (void)kfo;"]
        out += _in_order(forward_lines) + [f"    return {forward_result};", "}", "",
                "// What score_mod_fwd left out, for row q with origin `of`, in natural units: the forward adds it to",
                "// the row's LSE, which is then the LSE of the modified scores.",
                f"__device__ __forceinline__ float score_row(const ScoreHead& c, const int* __restrict__ {table}, "
                f"int {'q_local' if offsets else 'q'}, float {'qf_local' if offsets else 'qf'}, "
                f"float {'of_local' if offsets else 'of'}) {{"]
        if offsets:
            out += ["    const int* __restrict__ mask = table + 2;", "    const int q = q_local + table[0];",
                    "    const float qf = qf_local + c.q0, of = of_local + c.k0;"]
        out += ["    (void)mask; (void)q; (void)qf; (void)of;",
                f"    return {' + '.join(row_terms) or '0.f'};".replace("+ -", "- "), "}", "",
                "// The forward's scores are score_mod's divided by this, a positive factor (scale > 0 at launch).",
                "__device__ __forceinline__ float score_unit(const ScoreHead& c) {",
                "    (void)c;", f"    return {unit_field or '1.f'};", "}", ""]
    code = "\n".join(out) + "\n"
    return ScoreCode(code, grad == ONE, describe(mask.score), _HELPERS, row_terms=bool(row_terms),
                     unit=unit_field is not None)


def _in_order(body: list[str]) -> list[str]:
    """Generated statements ``const float vN = ...`` in definition order (N)."""
    return sorted(body, key=lambda line: int(line.split("=")[0].split()[-1][1:]))

