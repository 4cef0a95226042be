"""Calls adapted as upstream adapted its own (portkit.follow.calls): the argument-list edit
read off upstream's calls of a function whose parameters changed, made on the patch's."""

from portkit.follow.calls import adapt, calls_of, learn

BASE = b"""
void llm_a::build() { cur = build_attn(inp, gf,
        wo, bo, Qcur, Kcur, Vcur, nullptr, kq_scale, il); }
void llm_b::build() { cur = build_attn(inp, gf,
        wo, nullptr, q, k, v, nullptr, 1.0f/sqrtf(float(n)), il); }
void llm_c::build() { cur = build_attn(inp, gf,
        wo, bo, Qcur, Kcur, Vcur, kq_b, kq_scale, il); }
"""
# upstream: a new parameter after the eighth (sinks), every call passes nullptr there
SINKS = (BASE.replace(b"Vcur, nullptr,", b"Vcur, nullptr, nullptr,")
         .replace(b"v, nullptr,", b"v, nullptr, nullptr,")
         .replace(b"Vcur, kq_b,", b"Vcur, kq_b, nullptr,"))
PATCH_CALL = b"""void llm_solar::build() { cur = build_attn(inp, gf,
        wo, bo, Qcur, Kcur, Vcur, nullptr, kq_scale, il); }
"""


def test_learn_reads_the_argument_upstream_inserted_at_each_of_its_calls():
    learned = learn(BASE, SINKS, "build_attn", 10, lambda n: n == 11)
    assert learned is not None
    edit, n = learned
    assert n == 3 and [(op, new) for op, _, _, new in edit] == [("insert", "nullptr")]


def test_adapt_makes_upstreams_edit_on_the_patchs_call_and_keeps_its_line_breaks():
    fits = lambda n: n == 11  # noqa: E731
    edit, _ = learn(BASE, SINKS, "build_attn", 10, fits) or ((), 0)
    out, done = adapt(SINKS + PATCH_CALL, "build_attn", 10, edit, fits)
    assert done == 1
    assert out == SINKS + PATCH_CALL.replace(b"Vcur, nullptr,", b"Vcur, nullptr, nullptr,")


def test_a_dropped_argument_goes_with_the_separator_before_it():
    no_gf = BASE.replace(b"inp, gf,", b"inp,")
    fits = lambda n: n == 9  # noqa: E731
    learned = learn(BASE, no_gf, "build_attn", 10, fits)
    assert learned is not None and learned[0] == (("delete", 1, "gf", ""),)
    out, done = adapt(no_gf + PATCH_CALL, "build_attn", 10, learned[0], fits)
    assert done == 1 and out == no_gf + PATCH_CALL.replace(b"inp, gf,", b"inp,")


def test_a_dropped_argument_that_is_another_in_the_patchs_call_is_not_dropped():
    no_gf = BASE.replace(b"inp, gf,", b"inp,")
    fits = lambda n: n == 9  # noqa: E731
    edit, _ = learn(BASE, no_gf, "build_attn", 10, fits) or ((), 0)
    mine = PATCH_CALL.replace(b"inp, gf,", b"inp, graph,")
    assert adapt(no_gf + mine, "build_attn", 10, edit, fits) == (no_gf + mine, 0)


def test_upstreams_calls_that_disagree_teach_nothing():
    """Each call got an argument of its own: no one edit to make on the patch's."""
    own = (BASE.replace(b"Vcur, nullptr,", b"Vcur, nullptr, sinks_a,")
           .replace(b"v, nullptr,", b"v, nullptr, model.sinks,")
           .replace(b"Vcur, kq_b,", b"Vcur, kq_b, layer.s,"))
    assert learn(BASE, own, "build_attn", 10, lambda n: n == 11) is None


def test_one_call_of_upstreams_is_not_enough_to_learn_from():
    one = BASE.split(b"void llm_b")[0]
    assert learn(one, one.replace(b"Vcur, nullptr,", b"Vcur, nullptr, nullptr,"),
                 "build_attn", 10, lambda n: n == 11) is None


def test_a_call_that_fits_is_left_alone_and_so_is_one_the_edit_would_not_make_fit():
    fits = lambda n: n == 11  # noqa: E731
    edit, _ = learn(BASE, SINKS, "build_attn", 10, fits) or ((), 0)
    assert adapt(SINKS, "build_attn", 11, edit, fits) == (SINKS, 0)
    assert adapt(SINKS + PATCH_CALL, "build_attn", 10, edit, lambda n: n == 12) == (
        SINKS + PATCH_CALL, 0)


def test_calls_of_reads_free_and_qualified_calls_not_those_on_an_object():
    src = b"void f() { g(1, 2); ns::g(3); obj.g(4); p->g(5); h(g(6)); }\n"
    assert [c.args for c in calls_of(src, "g")] == [("1", "2"), ("3",), ("6",)]
