"""The rules `portkit drift` follows on real vendor bumps (issue 17), each on small C++/CMake
fixtures written here: text first (GNU patch's verdict), presence rules only for hunks that
do not apply (one ordered table, each rule positive and negative), semantic drift only for
symbols resolved without doubt, the series' own earlier patches in the target's view, and
one rename-likeness rule shared with the anchors."""

from __future__ import annotations

import difflib
import subprocess
from pathlib import Path

import pytest

from portkit.anchors import _name_likeness, akin
from portkit.drift import model as dm
from portkit.drift.classify import drift
from portkit.follow import DriftInput
from portkit.follow.presence import (
    PRESENCE_RULES,
    Place,
    added_lines_there,
    new_names_there,
    removed_lines_gone,
    there_under_upstreams_names,
)
from portkit.follow.target import _run_heads, _Target
from portkit.follow.words import _akin
from portkit.index import flat
from portkit.series import read_series
from portkit.tree import detect

STUB = "// the library\n"


def _tree(root: Path, files: dict[str, str]) -> Path:
    root.mkdir(parents=True)
    for rel, text in {"src/llama.cpp": STUB, **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def _diff(rel: str, before: str | None, after: str | None) -> str:
    old = before.splitlines(keepends=True) if before is not None else []
    new = after.splitlines(keepends=True) if after is not None else []
    head = (f"diff --git a/{rel} b/{rel}\n"
            + ("new file mode 100644\n" if before is None else ""))
    body = "".join(difflib.unified_diff(old, new, "/dev/null" if before is None else f"a/{rel}",
                                        f"b/{rel}", n=3))
    return head + body


def _series(root: Path, patches: list[list[str]]) -> Path:
    root.mkdir(parents=True)
    for number, sections in enumerate(patches, 1):
        (root / f"{number:04d}-p{number}.patch").write_text(
            f"From: A <a@b.c>\nSubject: [PATCH] p{number}\n\n---\n" + "".join(sections))
    return root


def _run(tmp: Path, base: dict[str, str], target: dict[str, str],
         patches: list[list[str]]) -> dm.TargetDrift:
    series = _series(tmp / "series", patches)
    job = DriftInput(read_series(series), str(series), detect(_tree(tmp / "base", base)),
                     [("t", detect(_tree(tmp / "target", target)))])
    return drift(job).targets[0]


FUNC = """\
int f(int x) {
    int y = x + 1;
    return y;
}

int g(int x) {
    return x * 2;
}
"""


# -- text first -------------------------------------------------------------------------------

def test_text_first_a_hunk_that_applies_is_never_present_upstream(tmp_path):
    """The target already uses every name the hunk brings (upstream has `y_max` elsewhere):
    the hunk still applies as text, so it is offset, not present-upstream."""
    base = "// one\n// two\n// three\n// four\n" + FUNC
    after = base.replace("    return y;\n", "    if (y > y_max) y = y_max;\n    return y;\n")
    target = "static const int y_max = 8;\n\n" + base + "int h() { return y_max; }\n"
    t = _run(tmp_path, {"src/a.cpp": base}, {"src/a.cpp": target},
             [[_diff("src/a.cpp", base, after)]])
    (hunk,) = t.patches[0].hunks
    assert hunk.status == dm.OFFSET, hunk.reason


def test_a_hunk_gnu_patch_lands_outside_its_function_keeps_its_verdict_with_a_note(tmp_path):
    """Upstream put a copy of foo's body where foo was (as bar) and moved foo 80 lines down:
    GNU patch lands foo's hunk in bar. Text keeps its verdict (clean); the reason says where
    foo went, for a reviewer, as rebase says it. A hunk that lands in its own function has
    no such note."""
    body = "".join(f"    int v{i} = v{i - 1} + {i};\n" for i in range(1, 8)) + "    return v7;\n"
    pads = "".join(f"static int pad_{i}(void) {{ return {i}; }}\n" for i in range(30))
    later = "".join(f"static int later_{i}(void) {{ return {i}; }}\n" for i in range(80))
    base = pads + "\nint foo(int v0) {\n" + body + "}\n"
    target = (pads + "\nint bar(int v0) {\n" + body + "}\n\n" + later + "\nint foo(int v0) {\n"
              + body + "}\n")
    mine = base.replace("v3 + 4", "v3 + 44")
    t = _run(tmp_path / "away", {"src/a.cpp": base}, {"src/a.cpp": target},
             [[_diff("src/a.cpp", base, mine)]])
    (hunk,) = t.patches[0].hunks
    assert hunk.status == dm.CLEAN
    assert "to review: GNU patch puts it at line" in hunk.reason and "foo at src/a.cpp:" in \
        hunk.reason
    home = _run(tmp_path / "home", {"src/a.cpp": base}, {"src/a.cpp": base + "\n" + later},
                [[_diff("src/a.cpp", base, mine)]])
    (hunk,) = home.patches[0].hunks
    assert hunk.status == dm.CLEAN and hunk.reason == "applies as it is"


def test_text_first_the_locator_does_not_overrule_a_fuzz_landing(tmp_path):
    """GNU patch places the hunk with fuzz; that is its verdict, even though the function its
    context came from was renamed in the target."""
    base = ("int alpha() {\n    int a = 1;\n    int b = 2;\n    int c = 3;\n"
            "    return a + b + c;\n}\n")
    after = base.replace("    int c = 3;\n", "    int c = 3;\n    c += 1;\n")
    target = base.replace("alpha", "alpha_renamed").replace("int a = 1;", "int a = 10;")
    t = _run(tmp_path, {"src/a.cpp": base}, {"src/a.cpp": target},
             [[_diff("src/a.cpp", base, after)]])
    (hunk,) = t.patches[0].hunks
    assert hunk.status == dm.FUZZ, hunk.reason


def test_a_patch_partly_upstream_needs_a_refresh(tmp_path):
    """One hunk is upstream already (it reverse-applies), the other still applies: the patch
    must be refreshed without the first one, so that hunk needs attention."""
    base = FUNC + "\n" + "\n".join(f"int pad{i};" for i in range(20)) + "\n\nint k = 1;\n"
    after = base.replace("    return y;\n", "    y += 2;\n    return y;\n").replace(
        "int k = 1;\n", "int k = 2;\n")
    target = base.replace("    return y;\n", "    y += 2;\n    return y;\n")
    t = _run(tmp_path, {"src/a.cpp": base}, {"src/a.cpp": target},
             [[_diff("src/a.cpp", base, after)]])
    statuses = [h.status for h in t.patches[0].hunks]
    assert statuses == [dm.CONFLICT, dm.OFFSET]
    assert "partly upstream" in t.patches[0].hunks[0].reason
    assert t.patches[0].status == dm.CONFLICT


LOG = """\
static int g_level = 0;

void set_level(int level) {
    g_level = level;
}

void other(void) {
    g_level = 0;
}
"""
GETTER = "int get_level(void) {\n    return g_level;\n}\n\n"
PAD = "".join(f"// line {i}\n" for i in range(30))


def test_a_patch_whose_every_hunk_lands_on_lines_upstream_added_is_present_upstream(tmp_path):
    """The patch adds get_level() after set_level(); upstream added the same function, the
    same lines, before it. GNU patch lands the hunk at an offset (git apply too): that would
    define get_level() twice. Every hunk of the patch is there, so the patch is upstream."""
    after = LOG.replace("void other", GETTER + "void other")
    target = PAD + LOG.replace("void set_level", GETTER + "void set_level")
    t = _run(tmp_path, {"src/log.c": LOG}, {"src/log.c": target},
             [[_diff("src/log.c", LOG, after)]])
    (hunk,) = t.patches[0].hunks
    assert hunk.status == dm.PRESENT_UPSTREAM, hunk.reason
    assert hunk.offset == 34  # 30 lines of padding and the 4 of upstream's getter above
    assert "its 2 added lines are there as one block, new since the base" in hunk.reason
    assert t.patches[0].status == dm.PRESENT_UPSTREAM


def test_a_block_upstream_added_is_a_note_where_the_rest_of_the_patch_is_not_there(tmp_path):
    """The same getter, and a second hunk upstream does not have: text stands for both
    hunks (offset), the first one says what to review."""
    tail = "".join(f"int pad{i};\n" for i in range(20)) + "\nint k = 1;\n"
    base = LOG + "\n" + tail
    after = base.replace("void other", GETTER + "void other").replace("int k = 1;",
                                                                     "int k = 2;")
    target = PAD + base.replace("void set_level", GETTER + "void set_level")
    t = _run(tmp_path, {"src/log.c": base}, {"src/log.c": target},
             [[_diff("src/log.c", base, after)]])
    first, second = t.patches[0].hunks
    assert (first.status, second.status) == (dm.OFFSET, dm.OFFSET)
    assert "to review: its 2 added lines are there as one block" in first.reason
    assert "to review" not in second.reason


def test_a_block_the_base_had_already_is_no_evidence(tmp_path):
    """The fork adds a second copy of lines the base already had: that is its choice, not
    upstream's change; the hunk is what text says, without a note."""
    base = LOG + "\n" + GETTER
    after = base.replace("void other", GETTER + "void other")
    target = PAD + base
    t = _run(tmp_path, {"src/log.c": base}, {"src/log.c": target},
             [[_diff("src/log.c", base, after)]])
    (hunk,) = t.patches[0].hunks
    assert hunk.status == dm.OFFSET and "to review" not in hunk.reason, hunk.reason


CACHE = """\
int cache_first(int x) {
    return x + 1;
}

int cache_second(int x) {
    return x * 2;
}

int cache_padding(int x) {
    return x - 3;
}
"""


def test_a_hunk_between_definitions_is_placed_after_the_one_it_follows(tmp_path):
    """The file was renamed and the definition the insertion goes before is gone: one line of
    its context is left, no place by lines; the nearest match is the end of the definition
    it goes after, where the locator found that one."""
    added = "int cache_third(int x) {\n    return x / 4;\n}\n\n"
    after = CACHE.replace("int cache_padding", added + "int cache_padding")
    target = "// moved here\n\n" + CACHE.split("int cache_padding")[0]
    t = _run(tmp_path, {"src/cache-old.cpp": CACHE}, {"src/cache.cpp": target},
             [[_diff("src/cache-old.cpp", CACHE, after)]])
    (hunk,) = t.patches[0].hunks
    assert hunk.status == dm.CONFLICT, hunk.reason
    assert "it goes after cache_second, which is cache_second at src/cache.cpp" in hunk.reason
    assert hunk.nearest is not None and hunk.nearest.file == "src/cache.cpp"
    assert hunk.nearest.text.endswith("    return x * 2;\n}") and hunk.nearest.line == 7


# -- the presence rules: one ordered table, each positive and negative --------------------

def test_presence_rules_are_one_ordered_table():
    assert [r.holds for r in PRESENCE_RULES] == [
        added_lines_there, removed_lines_gone, new_names_there, there_under_upstreams_names]


def _place(tmp: Path, base: str, target: str, hunk_text: str) -> Place:
    series = _series(tmp / "series", [[hunk_text]])
    s = read_series(series)
    job_base = detect(_tree(tmp / "base", {"src/a.cpp": base}))
    job_target = detect(_tree(tmp / "target", {"src/a.cpp": target}))
    from portkit.follow.sides import Side, _patterns
    t = _Target(s, Side("base", job_base.llama_root, _patterns(s)),
                Side("t", job_target.llama_root, _patterns(s)))
    hunk = s.patches[0].hunks[0]
    return Place(t, hunk, "src/a.cpp", None, target.splitlines())


def test_rule_added_lines_there(tmp_path):
    after = FUNC.replace("    return y;\n", "    y = clamp_y(y);\n    return y;\n")
    hunk = _diff("src/a.cpp", FUNC, after)
    yes = _place(tmp_path / "yes", FUNC, after.replace("x + 1", "x + 2"), hunk)
    assert added_lines_there(yes) == "all 1 added lines are there"
    no = _place(tmp_path / "no", FUNC, FUNC.replace("x + 1", "x + 2"), hunk)
    assert added_lines_there(no) == ""


def test_rule_removed_lines_gone(tmp_path):
    after = FUNC.replace("    int y = x + 1;\n", "")
    hunk = _diff("src/a.cpp", FUNC, after)
    yes = _place(tmp_path / "yes", FUNC, after.replace("return y", "return x + 1"), hunk)
    assert removed_lines_gone(yes) == "the 1 lines it removes are gone"
    no = _place(tmp_path / "no", FUNC, FUNC.replace("return y", "return y + 0"), hunk)
    assert removed_lines_gone(no) == ""
    rewritten = "int f(long x) {\n    long z = x;\n    return (int) z;\n}\n"
    gone = _place(tmp_path / "rewritten", FUNC, rewritten, hunk)
    assert removed_lines_gone(gone) == "", "the code around them is gone too: no evidence"


def test_rule_new_names_there(tmp_path):
    after = FUNC.replace("    return y;\n", "    trace_value(y, TRACE_LEVEL);\n    return y;\n")
    hunk = _diff("src/a.cpp", FUNC, after)
    used = FUNC.replace("    return y;\n", "    trace_value(TRACE_LEVEL, y);\n    return y;\n")
    assert new_names_there(_place(tmp_path / "yes", FUNC, used, hunk)) == \
        "it has trace_value, TRACE_LEVEL"
    half = FUNC.replace("    return y;\n", "    trace_value(y);\n    return y;\n")
    assert new_names_there(_place(tmp_path / "no", FUNC, half, hunk)) == ""
    # a name in a comment is not a name used: `// TRACE_LEVEL is gone` says nothing
    said = FUNC.replace("    return y;\n", "    trace_value(y); // no TRACE_LEVEL here\n"
                        "    return y;\n")
    assert new_names_there(_place(tmp_path / "comment", FUNC, said, hunk)) == ""


CHECK = """\
int llama_check(int x) {
    if (x < 0) {
        return -1;
    }
    int y = x * 2;
    int z = y + 3;
    if (z > 100) {
        return 1;
    }
    return 0;
}
"""


@pytest.mark.parametrize("upstream_took_it", [False, True])
def test_an_added_line_the_function_had_already_is_there_only_once_more(tmp_path,
                                                                        upstream_took_it):
    """A patch adds an early `return 0;` to a function that ends in one; upstream rewrote
    the lines around it. The one `return 0;` the target has is the base's own: not present
    upstream, unless the target has it once more than the base."""
    after = CHECK.replace("    int z = y + 3;\n", "    int z = y + 3;\n    return 0;\n")
    target = CHECK.replace("x * 2", "x * 4").replace("y + 3", "y + 5")
    if upstream_took_it:
        target = target.replace("    int z = y + 5;\n", "    int z = y + 5;\n    return 0;\n")
    t = _run(tmp_path, {"src/a.cpp": CHECK}, {"src/a.cpp": target},
             [[_diff("src/a.cpp", CHECK, after)]])
    (hunk,) = t.patches[0].hunks
    assert (hunk.status == dm.PRESENT_UPSTREAM) == upstream_took_it, hunk.reason


def test_a_line_the_hunk_moves_into_a_new_if_is_not_counted_as_one_more(tmp_path):
    """A patch puts `y = add(y, bias);` under a new `if (bias)`; upstream did the same and
    rewrote the lines around it. The line is not one more than the base had (the hunk
    removes it as it adds it): upstream's change is there, in its own words."""
    base = "int f(int x, int bias) {\n    int y = x * 2;\n    y = add(y, bias);\n" \
        "    return y;\n}\n"
    after = base.replace("    y = add(y, bias);\n",
                         "    if (bias) {\n        y = add(y, bias);\n    }\n")
    target = after.replace("x * 2", "x * 3").replace("return y;", "return y + 0;").replace(
        "if (bias) {", "if (bias) { // optional")
    t = _run(tmp_path, {"src/a.cpp": base}, {"src/a.cpp": target},
             [[_diff("src/a.cpp", base, after)]])
    (hunk,) = t.patches[0].hunks
    assert hunk.status == dm.PRESENT_UPSTREAM, hunk.reason


STEP = """\
int llama_step(int x) {
    int y = x * 2;
    int z = y + 3;
    trace_step(z);
    int q = z - 1;
    int r = q * q;
    return r;
}
"""


@pytest.mark.parametrize("upstream", ["changed it", "removed it"])
def test_a_removed_line_upstream_only_changed_is_not_gone(tmp_path, upstream):
    """A patch removes `trace_step(z);`; upstream rewrote the lines around it and made it
    `trace_step(z, true);`: the call is still there, so the removal is not upstream. Where
    upstream removed the call itself, it is."""
    after = STEP.replace("    trace_step(z);\n", "")
    target = STEP.replace("x * 2", "x * 4").replace("y + 3", "y + 5").replace("z - 1", "z - 2")
    target = target.replace("    trace_step(z);\n", "    trace_step(z, true);\n"
                            if upstream == "changed it" else "")
    t = _run(tmp_path, {"src/a.cpp": STEP}, {"src/a.cpp": target},
             [[_diff("src/a.cpp", STEP, after)]])
    (hunk,) = t.patches[0].hunks
    assert (hunk.status == dm.PRESENT_UPSTREAM) == (upstream == "removed it"), hunk.reason


def _arch_switch(cases: str) -> str:
    return ("int llama_n(enum llm_arch a) {\n    switch (a) {\n        case LLM_ARCH_A:\n"
            "            return 1;\n        case LLM_ARCH_B:\n            return 2;\n"
            f"{cases}        default:\n            return 0;\n    }}\n}}\n")


@pytest.mark.parametrize("value", ["7", "5"])
def test_a_case_upstream_added_with_other_values_is_not_present(tmp_path, value):
    """A patch adds `case LLM_ARCH_X: return 7;`; upstream added LLM_ARCH_X (and moved the
    lines so that the hunk fails) with `return 5;`. The name is there, the patch's value is
    not: not present upstream. With upstream's value the same, it is there."""
    header = {"src/a.h": "enum llm_arch { LLM_ARCH_A, LLM_ARCH_B, LLM_ARCH_X };\n"}
    base = "#include \"a.h\"\n\n" + _arch_switch("")
    after = base.replace("            return 2;\n",
                         f"            return 2;\n        case LLM_ARCH_X:\n"
                         f"            return {value};\n")
    mine = after.replace(f"return {value};", "return 7;")
    target = after.replace("case LLM_ARCH_B:\n            return 2;",
                           "case LLM_ARCH_B: // the second\n            return 2 * 1;")
    t = _run(tmp_path, {**header, "src/a.cpp": base}, {**header, "src/a.cpp": target},
             [[_diff("src/a.cpp", base, mine)]])
    (hunk,) = t.patches[0].hunks
    assert (hunk.status == dm.PRESENT_UPSTREAM) == (value == "7"), hunk.reason


def test_rule_there_under_upstreams_names(tmp_path):
    add = "int llama_n_ctx_per_seq(int n) {\n    return n / seq_count();\n}\n"
    after = FUNC + "\n" + add
    hunk = _diff("src/a.cpp", FUNC, after)
    renamed = FUNC + "\n" + add.replace("llama_n_ctx_per_seq", "llama_n_ctx_seq")
    yes = _place(tmp_path / "yes", FUNC, renamed, hunk)
    assert there_under_upstreams_names(yes) == "it has llama_n_ctx_per_seq as llama_n_ctx_seq"
    other = FUNC + "\n" + add.replace("llama_n_ctx_per_seq", "batch_limit")
    assert there_under_upstreams_names(_place(tmp_path / "no", FUNC, other, hunk)) == ""


# -- one rename-likeness rule ----------------------------------------------------------------

def test_rename_likeness_is_one_rule_for_drift_and_anchors():
    for a, b in (("q4_0", "q4_1"), ("LLM_TYPE_47M", "LLM_TYPE_537M")):
        assert not akin(a, b) and not _akin(a, b) and _name_likeness(a, b) == 0.0
    assert akin("llama_n_ctx_per_seq", "llama_n_ctx_seq") and _akin("n_ctx_per_seq", "n_ctx_seq")
    assert akin("kv_cache_unified", "unified_kv_cache")  # the same words
    assert not akin("llama_n_ctx_per_seq", "llama_batch_limit")


# -- semantic drift: only symbols resolved without doubt ---------------------------------

HEADER = """\
struct layer_dev {
    int dev;
    int path;
};

struct llama_hparams {
    int n_rot;
};

int helper(int a);
"""


@pytest.mark.parametrize(("line", "symbol"), [
    # a member name alone never resolves: a lambda parameter, a pair's field, another object
    ("    auto pick = [](int dev) { return dev + 1; };\n", None),
    ("    int s = entry.path + it.second;\n", None),
    # the receiver names its type: llama_hparams::n_rot, removed in the target
    ("    int r = hparams.n_rot;\n", "n_rot"),
    # a free function with one definition whose signature changed
    ("    int h = helper(1);\n", "helper"),
])
def test_semantic_drift_only_for_symbols_resolved_without_doubt(tmp_path, line, symbol):
    new_header = HEADER.replace("    int dev;\n", "").replace("    int path;\n", "").replace(
        "    int n_rot;\n", "    int n_rot_full;\n").replace("int helper(int a);",
                                                           "int helper(int a, int b);")
    body = "#include \"a.h\"\n\nint use() {\n    int x = 0;\n    return x;\n}\n"
    after = body.replace("    int x = 0;\n", "    int x = 0;\n" + line)
    t = _run(tmp_path, {"src/a.h": HEADER, "src/a.cpp": body},
             {"src/a.h": new_header, "src/a.cpp": body}, [[_diff("src/a.cpp", body, after)]])
    found = [s.symbol for s in t.patches[0].semantic]
    assert found == ([symbol] if symbol else []), t.patches[0].semantic


GRAPH = """\
struct graph_context {
    int build_attn(int inp, float * q, float * k, float scale, int il);
    int build_attn(long inp, float * q, float * k, float scale, int il);
    int build_ffn(int cur, int il = 0);
};
"""


@pytest.mark.parametrize(("call", "symbol"), [
    # an overloaded method, called bare from a derived class: no overload of the target
    # takes the 6 arguments the base's did (a parameter went)
    ("    cur = build_attn(inp, q, k, nullptr,\n                     0.5f, il);\n", "build_attn"),
    # as many arguments as the target's overloads take
    ("    cur = build_attn(inp, q, k, 0.5f, il);\n", None),
    # a default argument: the target takes 1 or 2 arguments, as the base did
    ("    cur = build_ffn(cur);\n", None),
    # a call on an object names another class's method: no claim
    ("    cur = other.build_attn(inp, q, k, nullptr, 0.5f, il);\n", None),
])
def test_a_call_with_an_arity_no_overload_takes_any_more_is_signature_drift(
        tmp_path, call, symbol):
    base_graph = GRAPH.replace("float * k, float scale", "float * k, float * b, float scale")
    body = ("#include \"graph.h\"\n\nstruct build_x : graph_context {\n"
            "    int run(int inp, float * q, float * k, int il) {\n        int cur = 0;\n"
            "        return cur;\n    }\n};\n")
    after = body.replace("        int cur = 0;\n", "        int cur = 0;\n" + call)
    t = _run(tmp_path, {"src/graph.h": base_graph, "src/x.cpp": body},
             {"src/graph.h": GRAPH, "src/x.cpp": body}, [[_diff("src/x.cpp", body, after)]])
    found = [s for s in t.patches[0].semantic]
    assert [s.symbol for s in found] == ([symbol] if symbol else []), found
    if symbol:
        assert found[0].change == "signature" and "6 argument(s)" in found[0].detail


CTX = """\
struct llama_model;

struct llama_context {
    unsigned n_ctx_per_seq() const;
    unsigned n_batch() const;
};

int model_size(const struct llama_model * m);
"""


@pytest.mark.parametrize(("use", "found"), [
    # the hunk declares what ctx is: llama_context::n_ctx_per_seq, which the class renamed
    ("unsigned seq_of(const llama_context * ctx) {\n    return ctx->n_ctx_per_seq();\n}\n",
     ["n_ctx_per_seq"]),
    # the receiver is not declared in the hunk and names no class: a member name alone
    ("unsigned seq_of(void) {\n    return current->n_ctx_per_seq();\n}\n", []),
    # `const struct llama_model *` and `const llama_model *` are one type
    ("int size_of(void) {\n    return model_size(nullptr);\n}\n", []),
])
def test_a_receiver_declared_in_the_hunk_resolves_its_member(tmp_path, use, found):
    new_ctx = CTX.replace("n_ctx_per_seq()", "n_ctx_seq()").replace(
        "const struct llama_model * m", "const llama_model * m")
    body = "#include \"ctx.h\"\n\nint keep() {\n    return 0;\n}\n"
    after = body + "\n" + use
    t = _run(tmp_path, {"src/ctx.h": CTX, "src/a.cpp": body},
             {"src/ctx.h": new_ctx, "src/a.cpp": body}, [[_diff("src/a.cpp", body, after)]])
    semantic = t.patches[0].semantic
    assert [s.symbol for s in semantic] == found, semantic
    if found:
        assert semantic[0].change == "renamed"
        assert "llama_context::n_ctx_per_seq is llama_context::n_ctx_seq" in semantic[0].detail


# -- the sequential view: earlier patches lend what they create ---------------------------

CMAKE = """\
add_library(ggml
            ggml.c
            ggml-alloc.c)
target_link_libraries(ggml PRIVATE m)
"""


def test_a_failing_patch_still_lends_the_file_it_creates(tmp_path):
    """Patch 1 creates mem_probe.cpp and adds it to CMakeLists.txt, where its context is gone
    (a conflict); patch 2 changes mem_probe.cpp: that file is in its target, so it applies."""
    created = "int mem_probe() {\n    return 0;\n}\n"
    listed = CMAKE.replace("ggml-alloc.c)", "ggml-alloc.c\n            mem_probe.cpp)")
    changed = created.replace("return 0;", "return 1;")
    target_cmake = CMAKE.replace("ggml.c\n            ggml-alloc.c)", "ggml-core.c)")
    t = _run(tmp_path, {"ggml/src/CMakeLists.txt": CMAKE},
             {"ggml/src/CMakeLists.txt": target_cmake},
             [[_diff("ggml/src/CMakeLists.txt", CMAKE, listed),
               _diff("ggml/src/mem_probe.cpp", None, created)],
              [_diff("ggml/src/mem_probe.cpp", created, changed)]])
    assert t.patches[0].status == dm.CONFLICT
    assert t.patches[1].status == dm.CLEAN, t.patches[1].hunks[0].reason


def test_a_declaration_an_earlier_patch_adds_is_not_removed(tmp_path):
    """Patch 1 declares debug_hook in a header it creates; patch 2 calls it. The base tree of
    the fork has the header, upstream's does not: the name is not "removed" there."""
    header = "void debug_hook(int node);\n"
    body = "#include \"a.h\"\n\nint use() {\n    int x = 0;\n    return x;\n}\n"
    after = body.replace("    int x = 0;\n", "    int x = 0;\n    debug_hook(x);\n")
    t = _run(tmp_path, {"src/a.cpp": body, "src/hook.h": header}, {"src/a.cpp": body},
             [[_diff("src/a.cpp", body, after)]])
    assert t.patches[0].status == dm.CLEAN and t.patches[0].semantic == ()


# -- where a hunk's lines went: the nearest match by text -------------------------------------

STEPS = """\
int f(int x) {
    int alpha = x + 1;
    int beta = alpha * 2;
    int gamma = beta - 3;
    int delta = gamma + 4;
    return delta;
}
"""


def _inserted(text: str) -> str:
    line = "    int beta = alpha * 2;\n"
    return text.replace(line, line + "    beta += 10;\n")


def test_a_hunk_whose_lines_left_their_function_is_placed_where_they_went(tmp_path):
    """Upstream moved f's body into a helper further down the file (and changed a line of
    the hunk's context): f is still there, but its lines are not in it; the nearest match is
    where they are now, not somewhere in f."""
    helper = STEPS.replace("int f(int x)", "static int f_steps(int x)").replace(
        "gamma = beta - 3", "gamma = beta - 5")
    target = "int f(int x) {\n    return f_steps(x);\n}\n\n" + "// filler\n" * 30 + "\n" + helper
    t = _run(tmp_path, {"src/a.cpp": STEPS}, {"src/a.cpp": target},
             [[_diff("src/a.cpp", STEPS, _inserted(STEPS))]])
    (hunk,) = t.patches[0].hunks
    assert hunk.status == dm.CONFLICT and hunk.moved_to is None, hunk.reason
    assert "its lines are not in f " in hunk.reason
    lines = target.splitlines()
    assert hunk.nearest is not None and hunk.nearest.file == "src/a.cpp"
    assert lines[hunk.nearest.line - 1] == "static int f_steps(int x) {"


def test_lines_that_stayed_in_their_function_are_placed_there(tmp_path):
    """The negative: f's lines are still in f (one context line changed): the hunk goes in
    f, where the locator found it."""
    target = "// filler\n" * 30 + STEPS.replace("gamma = beta - 3", "gamma = beta - 5")
    t = _run(tmp_path, {"src/a.cpp": STEPS}, {"src/a.cpp": target},
             [[_diff("src/a.cpp", STEPS, _inserted(STEPS))]])
    (hunk,) = t.patches[0].hunks
    assert hunk.moved_to is not None and hunk.moved_to.symbol == "f", hunk.reason
    assert 31 <= hunk.moved_to.line <= 37 and "are not in f" not in hunk.reason


def test_a_hunk_whose_function_left_the_file_is_placed_in_the_file_its_lines_went_to(tmp_path):
    """Upstream moved f out of a.cpp (renamed, into steps.cpp) and changed a line of the hunk's
    context: f is not in the target, a.cpp has none of its lines; steps.cpp has them."""
    moved = STEPS.replace("int f(int x)", "int steps_run(int x)").replace(
        "gamma = beta - 3", "gamma = beta - 5")
    t = _run(tmp_path, {"src/a.cpp": STEPS + "\nint other() {\n    return 0;\n}\n"},
             {"src/a.cpp": "int other() {\n    return 0;\n}\n", "src/steps.cpp": moved},
             [[_diff("src/a.cpp", STEPS, _inserted(STEPS))]])
    (hunk,) = t.patches[0].hunks
    assert hunk.status == dm.CONFLICT and "f is not in the target" in hunk.reason
    assert hunk.nearest is not None and hunk.nearest.file == "src/steps.cpp"
    assert hunk.nearest.line == 1



COMPUTE = """\
int llama_compute(int x) {
    int acc = 0;
    for (int i = 0; i < x; i++) {
        acc += i * 2;
        acc -= i / 3;
    }
    acc = acc * 7;
    return acc;
}
"""
OTHERS = "".join(f"int llama_other_{i}(int x) {{\n    return x + {i};\n}}\n\n" for i in range(20))


@pytest.mark.parametrize("copies", [1, 2])
def test_a_function_defined_in_two_other_files_is_not_placed_in_either_without_a_word(
        tmp_path, copies):
    """Upstream moved llama_compute out of a.cpp; the target defines it in two files (one as
    it was, one changed): which one the patch meant is not known, so the hunk is a conflict
    naming both, never relocated into the first by path order. With one definition, the
    hunk goes there."""
    base = OTHERS + COMPUTE
    target = {"src/a.cpp": OTHERS, "src/llama-compute.cpp": COMPUTE}
    if copies == 2:
        target["src/llama-compute-alt.cpp"] = COMPUTE.replace("i * 2", "i * 4")
    mine = base.replace("    acc = acc * 7;\n", "    acc = acc * 7;\n    acc += 1;\n")
    t = _run(tmp_path, {"src/a.cpp": base}, target, [[_diff("src/a.cpp", base, mine)]])
    (hunk,) = t.patches[0].hunks
    if copies == 2:
        assert hunk.status == dm.CONFLICT, hunk.reason
        assert "src/llama-compute.cpp" in hunk.reason and "llama-compute-alt" in hunk.reason
    else:
        assert hunk.status == dm.RELOCATED and hunk.moved_to is not None, hunk.reason
        assert hunk.moved_to.file == "src/llama-compute.cpp"


def test_a_gone_function_is_looked_for_in_the_file_with_most_of_its_lines_first_listed_on_a_tie(
        tmp_path):
    """f left a.cpp (renamed, context changed): of the files that have its lines, the one with
    the most of them is the nearest match; of two with as many, the first listed (one whose
    names are all there but not its lines, x_other.cpp, is no match)."""
    moved = STEPS.replace("int f(int x)", "int steps_run(int x)").replace(
        "gamma = beta - 3", "gamma = beta - 5")
    half = moved.replace("int delta = gamma + 4;", "int delta = gamma + 7;").replace(
        "return delta;", "return delta + 0;")
    names_only = "int g(int x) { int alpha = x; int beta = alpha; int gamma = beta;\n" \
        "int delta = gamma; return delta * 2; }\n"
    rest = "int other() {\n    return 0;\n}\n"
    target = {"src/a.cpp": rest, "src/b_half.cpp": half, "src/c_steps.cpp": moved,
              "src/d_steps.cpp": moved, "src/x_other.cpp": names_only}
    t = _run(tmp_path, {"src/a.cpp": STEPS + "\n" + rest}, target,
             [[_diff("src/a.cpp", STEPS, _inserted(STEPS))]])
    (hunk,) = t.patches[0].hunks
    assert hunk.nearest is not None and hunk.nearest.file == "src/c_steps.cpp", hunk.nearest


def test_run_heads_are_the_names_a_flattened_run_may_begin_with():
    assert _run_heads("intx=f(a_b,2);") == [("intx", "int", "in", "i"), ("f", ),
                                             ("a_b", "a_", "a")]
    assert _run_heads("0x1f+9;") == []



def test_a_file_the_index_leaves_out_has_its_own_names_once_every_indexed_file_was_read(
        tmp_path):
    """A source beside the hunk's file that the series' patterns do not index (upstream split
    ggml-metal.m into ggml-metal.cpp) is read for its names: "every indexed file's names"
    being known says nothing of it."""
    from portkit.follow.sides import Side
    root = _tree(tmp_path / "t", {"src/a.cpp": FUNC, "src/extra.mm": "int extra_only(void);\n"})
    side = Side("t", root, ("src/*.cpp",))
    assert "src/extra.mm" not in side.index.files and side.words["src/a.cpp"]
    assert side.file_words("src/extra.mm") == frozenset({"int", "extra_only", "void"})
    assert side.file_words("src/a.cpp") == side.words["src/a.cpp"]
    assert side.file_words("src/none.cpp") == frozenset()



def test_a_files_flattened_lines_are_kept_by_content_and_a_bad_entry_is_read_again(
        tmp_path, monkeypatch):
    """Side.flat_set: the set of an indexed file's flattened lines, kept on disk by its
    content's hash; an entry that is damaged or holds anything but lines is not believed."""
    import marshal

    from portkit.follow.sides import Side
    monkeypatch.setenv("PORTKIT_CACHE", str(tmp_path / "cache"))
    text = FUNC + "int  g( int x ) { return x; } // g\n"
    root = _tree(tmp_path / "t", {"src/a.cpp": text})
    expected = frozenset(flat(line) for line in text.splitlines())
    first = Side("t", root, ("src/*.cpp",))
    first.index  # noqa: B018 - the index first: its hash names the entry
    assert first.flat_set("src/a.cpp") == expected and first.flat_set("src/b.cpp") is None
    (entry,) = (tmp_path / "cache" / "flat").rglob("*.marshal")
    assert frozenset(marshal.loads(entry.read_bytes())) == expected
    for bad in (b"\x00garbage", marshal.dumps([1, 2]), marshal.dumps({"x": 1})):
        entry.write_bytes(bad)
        again = Side("t", root, ("src/*.cpp",))
        again.index  # noqa: B018
        assert again.flat_set("src/a.cpp") == expected


SPLIT = "".join(f"static int part_{i}(int x) {{\n    return x + {i};\n}}\n\n"
                for i in range(12))


def _relocated_to(hunk: dm.HunkDrift, rel: str, says: str) -> None:
    assert hunk.status == dm.RELOCATED, hunk.reason
    assert hunk.moved_to is not None and hunk.moved_to.file == rel
    assert says in hunk.reason


@pytest.mark.parametrize(("moved", "lands"), [
    # the lines went to a.cpp with a line of the context rewritten: fuzz takes it there
    (STEPS.replace("int f(int x)", "static int f(int x, int y)"), True),
    # the lines went to a.cpp, but the line the patch rewrites is not there as it was, nor
    # are its neighbours: no landing
    (STEPS.replace("int alpha = x + 1;", "int alpha = x + 2;").replace(
        "int beta = alpha * 2;", "int beta = alpha * 3;").replace(
        "int gamma = beta - 3;", "int gamma = beta - 4;"), False),
])
def test_a_hunk_whose_file_is_gone_lands_where_its_lines_went(tmp_path, moved, lands):
    """Upstream split a.m (git's rename rule finds no file it became) and f went to a.cpp:
    the hunk is tried at the nearest match of its lines there, as GNU patch would try it,
    and is relocated there only where it lands."""
    old = SPLIT + STEPS
    new = old.replace("    int beta = alpha * 2;\n", "    int beta = alpha * 20;\n")
    t = _run(tmp_path, {"src/a.m": old}, {"src/a.cpp": "// split\n\n" + moved,
                                            "src/b.cpp": SPLIT},
             [[_diff("src/a.m", old, new)]])
    (hunk,) = t.patches[0].hunks
    if lands:
        _relocated_to(hunk, "src/a.cpp", "its lines are at src/a.cpp:")
    else:
        assert hunk.status == dm.CONFLICT, hunk.reason
        assert hunk.nearest is not None and hunk.nearest.file == "src/a.cpp"


OPS = """\
static void compute_pad(int * dst) {
    dst[0] = 1;
    dst[1] = 2;
}

// compute_arange

static void compute_arange(int * dst) {
    dst[0] = 3;
    dst[1] = 4;
}
"""

DISPATCH = """\
void compute(int op, int * dst) {
    switch (op) {
        case 0: compute_pad(dst); break;
        case 1: compute_arange(dst); break;
    }
}
"""


def _with_unpad(text: str) -> str:
    return text.replace("// compute_arange\n", "static void compute_unpad(int * dst) {\n"
                        "    dst[0] = 0;\n}\n\n// compute_arange\n")


@pytest.mark.parametrize(("moved", "lands"), [
    # upstream moved both definitions, side by side, to ops.cpp (and made them extern)
    ({"src/ops.cpp": OPS.replace("static void", "void")}, True),
    # they went to two files: nothing says where the new one goes
    ({"src/ops.cpp": OPS.split("// compute_arange")[0],
      "src/more.cpp": "// compute_arange" + OPS.split("// compute_arange")[1]}, False),
])
def test_a_hunk_between_definitions_upstream_moved_goes_where_they_went(tmp_path, moved,
                                                                         lands):
    """The patch adds a function between compute_pad and compute_arange of cpu.c; upstream
    moved both to ops.cpp (cpu.c keeps its dispatch): the hunk lands between them there,
    relocated, for review; where the two went to different files it stays a conflict."""
    old = DISPATCH + "\n" + OPS
    t = _run(tmp_path, {"src/cpu.c": old}, {"src/cpu.c": DISPATCH, **moved},
             [[_diff("src/cpu.c", old, _with_unpad(old))]])
    (hunk,) = t.patches[0].hunks
    if lands:
        _relocated_to(hunk, "src/ops.cpp", "compute_pad and compute_arange")
    else:
        assert hunk.status == dm.CONFLICT, hunk.reason
        assert hunk.moved_to is None


def test_a_file_renamed_is_followed_by_gits_rename_rule(tmp_path):
    """examples/llava/clip.cpp became tools/mtmd/clip.cpp (outside what drift indexes, so no
    symbol votes for it): git's rename rule (the same name, at least half alike) finds it,
    and the hunk lands there."""
    old = STEPS + "\n" + FUNC
    new = "// moved\n\n" + old
    t = _run(tmp_path, {"examples/llava/clip.cpp": old}, {"tools/mtmd/clip.cpp": new},
             [[_diff("examples/llava/clip.cpp", old, _inserted(old))]])
    (hunk,) = t.patches[0].hunks
    assert hunk.status == dm.RELOCATED, hunk.reason
    assert hunk.moved_to is not None and hunk.moved_to.file == "tools/mtmd/clip.cpp"
    assert hunk.moved_to.line == 3


def test_a_file_too_unlike_is_not_taken_for_the_renamed_one(tmp_path):
    """The negative: a file of the same name that shares too little is not where it went."""
    old = STEPS + "\n" + FUNC
    t = _run(tmp_path, {"examples/llava/clip.cpp": old},
             {"tools/mtmd/clip.cpp": "int unrelated() {\n    return 42;\n}\n" * 3},
             [[_diff("examples/llava/clip.cpp", old, _inserted(old))]])
    (hunk,) = t.patches[0].hunks
    assert hunk.status == dm.CONFLICT and hunk.moved_to is None
    assert hunk.nearest is None or hunk.nearest.file != "tools/mtmd/clip.cpp"


TABLE = """\
int before_table() {
    return 0;
}

static const std::map<std::string, int> TABLE = {
    {"ten", 10},
    {"twenty", 20},
    {"thirty", 30},
    {"forty", 40},
    {"fifty", 50},
};

int after_table() {
    int one = 1;
    return one;
}
"""


def test_context_an_earlier_patch_added_is_followed_by_the_lines_the_base_has(tmp_path):
    """Patch 1 adds twelve rows to a table; patch 2's hunk (whose context holds some of
    them) does not apply on the target. Its place in the base is where the base's own lines
    of its context are, not its line number, which counts patch 1's rows and points past
    the table: the nearest match is in the table, not in the function after it."""
    rows = "".join(f'    {{"row {k}", {21 + k}}},\n' for k in range(12))
    first = TABLE.replace('    {"twenty", 20},\n', '    {"twenty", 20},\n' + rows)
    row = '    {"thirty", 30},\n'
    second = first.replace(row, row + '    {"thirty-five", 35},\n')
    target = "// upstream's header\n" * 40 + TABLE.replace('{"forty", 40}', '{"forty-five", 45}')\
        .replace('{"fifty", 50}', '{"fifty-five", 55}')
    t = _run(tmp_path, {"src/a.cpp": TABLE}, {"src/a.cpp": target},
             [[_diff("src/a.cpp", TABLE, first)], [_diff("src/a.cpp", first, second)]])
    (hunk,) = t.patches[1].hunks
    assert hunk.status in (dm.CONFLICT, dm.RELOCATED), hunk.reason
    assert hunk.symbol != "after_table", hunk.reason
    place = hunk.moved_to or hunk.nearest
    assert place is not None and place.file == "src/a.cpp"
    table = (tmp_path / "target" / "src" / "a.cpp").read_text().splitlines()
    start = table.index("static const std::map<std::string, int> TABLE = {") + 1
    assert start <= place.line <= start + 20, (place, start)


def test_lines_found_as_often_at_two_places_are_no_nearest_match(tmp_path):
    """Upstream made two copies of the hunk's code and changed both alike: as many of its
    lines are at each place, and the base's lines around it are at neither, so the text does
    not say which it is: no nearest match rather than a wrong one. One copy alone is a
    place."""
    old = RUN.format(n="one")
    twice = CHANGED.format(n="a") + "// between\n" * 20 + CHANGED.format(n="b")
    for target, places in ((twice, 0), (CHANGED.format(n="a"), 1)):
        room = tmp_path / str(places)
        t = _run(room, {"src/a.cpp": old}, {"src/a.cpp": target},
                 [[_diff("src/a.cpp", old, _inserted(old))]])
        (hunk,) = t.patches[0].hunks
        assert hunk.status == dm.CONFLICT, hunk.reason
        assert (hunk.nearest is not None) == bool(places), hunk.nearest


def test_a_tie_between_two_places_is_broken_by_the_lines_around_the_hunk_in_the_base(tmp_path):
    """The same two copies, but the function the base has before the hunk's is still before
    the second one: that is where the hunk's lines are."""
    old = FUNC + "\n" + RUN.format(n="one")
    target = CHANGED.format(n="a") + "// between\n" * 20 + FUNC + "\n" + CHANGED.format(n="b")
    t = _run(tmp_path, {"src/a.cpp": old}, {"src/a.cpp": target},
             [[_diff("src/a.cpp", old, _inserted(old))]])
    (hunk,) = t.patches[0].hunks
    assert hunk.status == dm.CONFLICT, hunk.reason
    assert hunk.nearest is not None
    assert target.splitlines()[hunk.nearest.line - 1] == "void step_b(int x) {"


RUN = ("void run_{n}(int x) {{\n    int alpha = x + 1;\n    int beta = alpha * 2;\n"
       "    int gamma = beta - 3;\n    int delta = gamma + 4;\n    return;\n}}\n\n")
CHANGED = RUN.replace("gamma = beta - 3", "gamma = beta - 7").replace("void run_{n}",
                                                                       "void step_{n}")


def _git_diff(tmp: Path, rel: str, before: str, after: str) -> str:
    """git's diff of one file (with its "No newline at end of file" marks)."""
    room = tmp / "diffs"
    room.mkdir(exist_ok=True)
    (room / "a").write_text(before)
    (room / "b").write_text(after)
    done = subprocess.run(["git", "diff", "--no-index", "--no-color", "a", "b"], cwd=room,
                          capture_output=True, text=True, check=False)
    body = done.stdout.split("\n@@", 1)[1]
    return f"diff --git a/{rel} b/{rel}\n--- a/{rel}\n+++ b/{rel}\n@@" + body


ENDS = """\
int first(int il) {
    if (il < 4) {
        return il;
    }

    abort_now("fatal error");
}

int second(int il) {
    return il * 8;
}"""


def test_a_hunk_that_ends_its_file_is_placed_at_the_target_files_end(tmp_path):
    """Patch 1 appends a function to a file without a final newline; patch 2 appends another
    after it, its context closing lines that the first function has too. Upstream added one
    of its own at the end, so patch 2 does not apply: its place is the file's end, not the
    end of the first function, whose closing lines look the same."""
    third = "\n\nint third(int il) {\n    if (il < 16) {\n        return il;\n    }\n\n" \
        "    abort_now(\"fatal error\");\n}"
    first = ENDS + third
    second = first + "\n\nint fourth(int il) {\n    return il * 2;\n}"
    target = ENDS + "\n\nint upstreams(int il) {\n    return -il;\n}\n"
    t = _run(tmp_path, {"src/a.cpp": ENDS}, {"src/a.cpp": target},
             [[_git_diff(tmp_path, "src/a.cpp", ENDS, first)],
              [_git_diff(tmp_path, "src/a.cpp", first, second)]])
    hunk = t.patches[1].hunks[-1]
    assert hunk.status == dm.CONFLICT and hunk.symbol is None, hunk.reason
    assert hunk.nearest is not None
    lines = len((tmp_path / "target" / "src" / "a.cpp").read_text().splitlines()) + 10
    assert lines - 16 <= hunk.nearest.line <= lines, hunk.nearest


def test_lines_a_line_apart_still_place_a_hunk(tmp_path):
    """Upstream added a line between two of the hunk's context lines and rewrote the others:
    the two left are one line further apart than in the base, and together they still say
    where the hunk's code is."""
    target = "// filler\n" * 20 + (
        "int g(long x) {\n    int alpha = x + 1;\n    // upstream's note\n"
        "    int beta = alpha * 2;\n    int gamma = beta - 30;\n    int delta = gamma + 40;\n"
        "    return delta * 2;\n}\n")
    t = _run(tmp_path, {"src/a.cpp": STEPS}, {"src/a.cpp": target},
             [[_diff("src/a.cpp", STEPS, _inserted(STEPS))]])
    (hunk,) = t.patches[0].hunks
    assert hunk.status == dm.CONFLICT, hunk.reason
    place = hunk.nearest
    assert place is not None and 20 <= place.line <= 23, hunk


def test_a_located_function_whose_lines_went_to_another_file_is_placed_there(tmp_path):
    """f is still in a.cpp (a wrapper now), its lines went to steps.cpp: the nearest match is
    in steps.cpp, not in f."""
    moved = STEPS.replace("int f(int x)", "int steps_run(int x)").replace(
        "gamma = beta - 3", "gamma = beta - 5")
    t = _run(tmp_path, {"src/a.cpp": STEPS},
             {"src/a.cpp": "int f(int x) {\n    return steps_run(x);\n}\n",
              "src/steps.cpp": moved},
             [[_diff("src/a.cpp", STEPS, _inserted(STEPS))]])
    (hunk,) = t.patches[0].hunks
    assert hunk.status == dm.CONFLICT and "its lines are not in f " in hunk.reason, hunk
    assert hunk.nearest is not None and hunk.nearest.file == "src/steps.cpp"


def test_a_folder_of_the_target_that_cannot_be_read_is_no_candidate_for_a_renamed_file(
        tmp_path, monkeypatch):
    """git's rename rule lists the target's files: a folder it may not read is skipped (as
    glob skips it), not an error, and the file is still followed where it can be read. (The
    folder's refusal is simulated: these tests may run as root, whom no mode stops.)"""
    import os

    from portkit.follow.renames import Files
    old = STEPS + "\n" + FUNC
    base = _tree(tmp_path / "base", {"examples/llava/clip.cpp": old})
    target = _tree(tmp_path / "t", {"tools/mtmd/clip.cpp": "// moved\n\n" + old,
                                    "locked/x.cpp": "int x;\n"})
    scandir = os.scandir

    def refusing(path):  # type: ignore[no-untyped-def]
        if os.path.basename(os.fspath(path)) == "locked":
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return scandir(path)

    monkeypatch.setattr("portkit.follow.renames.os.scandir", refusing)
    files = Files(target, base)
    assert "locked/x.cpp" not in {r for rels in files.by_name().values() for r in rels}
    assert "src/llama.cpp" in files.by_name()["llama.cpp"]
    assert files.renamed("examples/llava/clip.cpp", old.encode(),
                         lambda rel: (target / rel).read_bytes()) == "tools/mtmd/clip.cpp"


SWITCH = """\
enum arch { ARCH_A, ARCH_B, ARCH_C };

const char * name_of(enum arch a) {
    switch (a) {
        case ARCH_A:
            return "a";
        case ARCH_B:
            return "b";
        default:
            return "?";
    }
}

int one(void) { return 1; }
int two(void) { return 2; }
int three(void) { return 3; }
int four(void) { return 4; }

int width(void) {
    return 1;
}
"""


def _a_case_upstream_has(mine: str) -> tuple[str, str]:
    """The base, and the target: upstream added `case ARCH_C: return "c";` at the top of the
    switch, so that the patch's case (after ARCH_B, `mine` its statement) still lands."""
    target = SWITCH.replace("    switch (a) {\n",
                            "    switch (a) {\n        case ARCH_C:\n            return \"c\";\n")
    return target, SWITCH.replace("            return \"b\";\n",
                                  f"            return \"b\";\n        case ARCH_C:\n{mine}")


def _switch_hunks(tmp: Path, target: str, mine: str) -> tuple[dm.HunkDrift, ...]:
    """The drift of the one patch SWITCH -> `mine` on `target`, hunk by hunk."""
    return _run(tmp, {"src/a.cpp": SWITCH}, {"src/a.cpp": target},
                [[_diff("src/a.cpp", SWITCH, mine)]]).patches[0].hunks


def test_a_landing_that_writes_a_case_twice_with_code_of_its_own_is_a_conflict(tmp_path):
    """The patch's `case ARCH_C:` lands as text, but upstream has that case in the switch
    already: with a statement of its own, the file would have the case twice and not compile,
    so the hunk needs a human, saying which case and that the two must become one."""
    (hunk,) = _switch_hunks(tmp_path, *_a_case_upstream_has("            return \"c-mine\";\n"))
    assert hunk.status == dm.CONFLICT, hunk.reason
    assert "case ARCH_C is in that switch already (line 5)" in hunk.reason
    assert "must become one" in hunk.reason


def test_a_landing_that_only_repeats_upstreams_case_is_present_upstream(tmp_path):
    """The patch's whole change is a case upstream has in the same form: present upstream
    (landing it would write the case twice), not clean."""
    (hunk,) = _switch_hunks(tmp_path, *_a_case_upstream_has("            return \"c\";\n"))
    assert hunk.status == dm.PRESENT_UPSTREAM, hunk.reason
    assert "case ARCH_C is in that switch already" in hunk.reason


def test_a_repeated_case_beside_a_change_upstream_lacks_is_a_refresh(tmp_path):
    """The patch repeats upstream's case and also changes width(), which upstream does not
    have: the repeat is a hunk to leave out (attention), the other hunk keeps what text says
    (it lands 2 lines away, below upstream's case)."""
    target, mine = _a_case_upstream_has("            return \"c\";\n")
    mine = mine.replace("int width(void) {\n    return 1;", "int width(void) {\n    return 2;")
    t = _run(tmp_path, {"src/a.cpp": SWITCH}, {"src/a.cpp": target},
             [[_diff("src/a.cpp", SWITCH, mine)]])
    first, second = t.patches[0].hunks
    assert first.status == dm.CONFLICT and "case ARCH_C is in that switch already" in \
        first.reason, first.reason
    assert second.status == dm.OFFSET and second.reason == "applies +2 lines away"


def test_a_case_the_target_does_not_have_lands_clean(tmp_path):
    """The negative: the same patch on the base itself (no case ARCH_C there) is clean."""
    _, mine = _a_case_upstream_has("            return \"c\";\n")
    t = _run(tmp_path, {"src/a.cpp": SWITCH}, {"src/a.cpp": SWITCH},
             [[_diff("src/a.cpp", SWITCH, mine)]])
    (hunk,) = t.patches[0].hunks
    assert hunk.status == dm.CLEAN, hunk.reason
