"""Explain: each stage's text says what that stage computed."""
from pathlib import Path

import maskc
from maskc.explain import bounds_text, cond_text, explain, normal_text, ranges_text, resolved_text, source_text
from maskc.pipeline import PASSES, compile_all, load_program

EXAMPLES = Path(__file__).parent.parent / "examples"


def test_every_pass_is_a_section_with_its_why():
    masks = compile_all(EXAMPLES / "document.mask")
    text = explain(load_program(EXAMPLES / "document.mask").main, masks)
    for name, why, _ in PASSES:
        assert f"== {name}: {why}" in text
    assert text.index("== parse") < text.index("== resolve") < text.index("== normalize") < text.index("== ranges")


def test_parse_section_lists_rules_as_written_with_lines():
    text = source_text(load_program(EXAMPLES / "hstu.mask").main)
    assert "mask hstu(users: segments, context: int = 0, targets: per users, max_attn_len: int = 0)" in text
    assert "line 11   let      d = id(q) - id(k)" in text
    assert "line 15   allow    same(users), context > 0, id(q) == 0, id(k) < n_hist(k)   (4 condition(s))" in text


def test_resolved_rules_inline_calls_of_other_masks():
    mask = maskc.load(EXAMPLES / "global_local.mask")
    text = resolved_text(mask.resolved)
    assert "allow   k <= q and q - k < window   (line 7)" in text
    assert "require globals >= 0" in text


def test_cond_text_parenthesizes_by_precedence():
    mask = maskc.compile_mask("mask m(a: int)\n  allow (k < a or k > q) and q - (k - a) * 2 >= 0\n")
    assert cond_text(mask.resolved.rules[0].cond) == "(k < a or k > q) and q - (k - a) * 2 >= 0"


def test_normal_form_is_printed_as_atoms():
    mask = maskc.load(EXAMPLES / "sliding_window.mask")
    text = normal_text(mask.normal)
    assert "allow [0] -window - k + q + 1 <= 0 and k - q <= 0" in text


def test_ranges_show_bounds_guards_opaque_and_exactness():
    causal = maskc.load(EXAMPLES / "causal.mask")
    assert bounds_text(causal.ranges.allow[0]) == ["k >= 0", "k <= q", "exact"]
    doc = ranges_text(maskc.load(EXAMPLES / "document.mask").ranges)
    assert "guards: -docs.index(q) <= 0" in doc and "k >= docs.start(q)" in doc
    assert "k <= min(docs.end(q) - 1, q)" in doc or "k <= min(q, docs.end(q) - 1)" in doc
    clear = ranges_text(maskc.load(EXAMPLES / "clear.mask").ranges)
    assert "tile classes are exact" in clear and "opaque (checked per pair)" in clear
    assert "one interval of keys per chunk: J1 = (-text + k) // width" in clear
    assert "each J1 from max(" in clear and "keys k from max(" in clear
    odd = ranges_text(maskc.compile_mask("mask m()\n  allow (q - k) * (q + k) < 9\n", path="odd.mask").ranges)
    assert "sound but not exact for this mask: 1 region(s)" in odd
    assert "not exact, tiles it touches are only sound: (-k + q)*(k + q): a product" in odd and "(odd.mask:2:9)" in odd


def test_bound_section_has_tile_counts_and_descriptor_runs():
    mask = maskc.load(EXAMPLES / "causal.mask")
    bound = mask.bind(seq_len=512)
    text = explain(load_program(EXAMPLES / "causal.mask").main, (mask,), {"causal": bound})
    assert "█ FULL 6   ▒ PARTIAL 4   · EMPTY 6" in text
    assert "row block 3: kv [0, 3) FULL, kv [3, 4) PARTIAL" in text


def test_classify_says_why_classes_are_or_are_not_exact(monkeypatch):
    from maskc.explain import classify_text
    import maskc.analysis.classify as classify_module
    floors = maskc.compile_mask("mask m(a: int, c: int)\n  allow k // a + k // c <= q\n")
    assert not floors.exact                            # a and c unknown: no common chunk on their face
    assert "exact for these values" in classify_text(floors.bind(seq_len=64, a=4, c=8), 16, 16)
    assert "see the ranges stage" in classify_text(floors.bind(seq_len=64, a=4, c=6), 16, 16)
    clear = maskc.load(EXAMPLES / "clear.mask")
    assert "classes are exact\n" in classify_text(clear.bind(seq_len=300, text=20, width=16, radius=3), 32, 32) + "\n"
    monkeypatch.setattr(classify_module, "_BUDGET", 0)
    assert "more intervals than classification enumerates" in classify_text(
        clear.bind(seq_len=300, text=20, width=16, radius=3), 32, 32)


def test_schedule_says_how_the_softmax_of_a_modifier_runs():
    """The schedule section's softmax line follows the plan: a fixed maximum for a softcap binding whose caps allow
    one (bf16), the online softmax past the cap limit, in fp16, and for modifiers that bound nothing."""
    from maskc.explain import schedule_text

    soft, alibi = (maskc.load(EXAMPLES / f"{n}.mask") for n in ("softcap", "alibi"))
    line = lambda *a, **kw: schedule_text(128, *a, **kw).splitlines()[-1]   # noqa: E731
    assert "against a fixed maximum" in line("bf16", mask=soft, bound=soft.bind(256, cap=50.0))
    assert "a cap of this binding is past 50.6" in line("bf16", mask=soft, bound=soft.bind(256, cap=60.0))
    assert "needs bf16" in line("fp16", mask=soft, bound=soft.bind(256, cap=30.0))
    assert "does not bound the scores" in line("bf16", mask=alibi, bound=alibi.bind(256, num_heads=2, slope=[0.5, 0.25]))
    assert "give --seq-len" in line("bf16", mask=soft) and "softmax" not in schedule_text(128, "bf16")


def test_schedule_says_how_partial_tiles_are_masked():
    """A mask with a tile path gets a line naming the forward's masking of PARTIAL tiles, the stored words' size
    (from the PARTIAL tiles counted at the forward's tiles) for a binding; other masks get none."""
    from maskc.explain import schedule_text
    from maskc.options import Options

    clear = maskc.load(EXAMPLES / "clear.mask")
    bound = clear.bind(8192)
    text = schedule_text(128, "bf16", mask=clear, bound=bound)
    partial = bound.descriptor(128, 128).tile_map.counts()["PARTIAL"]
    assert f"read per tile: {partial * 128 * 16 / 2**20:.1f} MiB at these tiles" in text
    assert "PARTIAL tiles: bits" in schedule_text(128, "bf16", Options(partial_tiles="bits"), mask=clear)
    causal = maskc.load(EXAMPLES / "causal.mask")
    assert "PARTIAL tiles" not in schedule_text(128, "bf16", mask=causal, bound=causal.bind(4096))
