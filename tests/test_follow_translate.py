"""Translate (portkit.follow.translate): a hunk whose code upstream moved and reworded is
written at the one run of lines that is its kept and deleted lines in upstream's words, with
the same rewording; anything less than sure is None."""

from portkit.follow.translate import translate
from portkit.series import parse_patch

BASE_FN = """void load_vocab(loader & ml, model & m) {
    if (m.vocab.type == VOCAB_BPE) {
        m.vocab.clean_spaces = true;
        if (pre == "default") {
            m.vocab.type_pre = PRE_DEFAULT;
        } else {
            throw std::runtime_error("unknown pre-tokenizer");
        }
    }
}
"""
# upstream: the function is a member now, in another file, its fields its own
TARGET_FN = """// vocab.cpp
int unrelated = 0;

void vocab::impl::load(loader & ml) {
    if (type == VOCAB_BPE) {
        clean_spaces = true;
        if (pre == "default") {
            pre_type = PRE_DEFAULT;
        } else {
            throw std::runtime_error("unknown pre-tokenizer");
        }
    }
}
"""
PATCH = b"""--- a/src/model.cpp
+++ b/src/model.cpp
@@ -4,7 +4,8 @@ void load_vocab(loader & ml, model & m) {
         if (pre == "default") {
             m.vocab.type_pre = PRE_DEFAULT;
         } else {
-            throw std::runtime_error("unknown pre-tokenizer");
+            LOG_WARN("unknown pre-tokenizer, using default");
+            m.vocab.type_pre = PRE_DEFAULT;
         }
     }
 }
"""


def hunk(text: bytes = PATCH):
    return parse_patch("p.patch", text).hunks[0]


def test_a_moved_and_reworded_hunk_is_written_in_upstreams_words():
    done = translate(hunk(), TARGET_FN.encode(), 8)
    assert done is not None
    assert done.line == 7
    assert done.rewordings == (("m.vocab.type_pre", "pre_type"),)
    assert done.data.decode() == TARGET_FN.replace(
        '            throw std::runtime_error("unknown pre-tokenizer");\n',
        '            LOG_WARN("unknown pre-tokenizer, using default");\n'
        "            pre_type = PRE_DEFAULT;\n")


def test_the_indentation_moves_with_upstreams():
    deeper = "\n".join("    " + x if x.strip() and not x.startswith("//") and "unrelated" not in x
                       else x for x in TARGET_FN.split("\n"))
    done = translate(hunk(), deeper.encode(), 8)
    assert done is not None
    assert '\n                LOG_WARN("unknown pre-tokenizer, using default");\n' \
        in done.data.decode()


def test_nothing_without_a_rename_to_vouch_for_the_place():
    """Lines that are all there as they were (a block upstream left alone elsewhere, or one
    like it): no rewording says this is where the code went."""
    same = BASE_FN.encode()
    assert translate(hunk(), same, 4) is None


def test_nothing_where_the_old_phrase_is_still_in_the_target():
    """`m.vocab.type_pre` is still used: `pre_type` is another line, not its rename."""
    both = TARGET_FN + "void other() { m.vocab.type_pre = 0; }\n"
    assert translate(hunk(), both.encode(), 8) is None


def test_nothing_where_two_runs_are_in_reach():
    twice = TARGET_FN + TARGET_FN.replace("// vocab.cpp\nint unrelated = 0;\n", "")
    assert translate(hunk(), twice.encode(), 10) is None


def test_nothing_where_a_line_it_writes_needs_a_word_not_learned():
    """The added line also uses `m.vocab_extra`: `m` is the old code's, the target's file
    has no `m`, and no rewording says what it became."""
    extra = PATCH.replace(b"+            m.vocab.type_pre = PRE_DEFAULT;\n",
                          b"+            m.vocab.type_pre = PRE_DEFAULT; m.vocab_extra = 1;\n")
    assert translate(hunk(extra), TARGET_FN.encode(), 8) is None


def test_nothing_where_a_kept_line_has_no_counterpart():
    """Upstream put a line inside the run: not one for one, not sure."""
    inside = TARGET_FN.replace("        } else {\n", "        } else if (pre.empty()) {\n"
                               "            pre_type = PRE_DEFAULT;\n        } else {\n")
    assert translate(hunk(), inside.encode(), 8) is None


BLOCK = """if (ALL_VARIANTS)
    add_variant(skylakex     SSE42 AVX F16C AVX2 BMI2 FMA AVX512)
    add_variant(alderlake    SSE42 AVX F16C AVX2 BMI2 FMA AVX_VNNI)
    if (NOT MSVC)
        add_variant(sapphirerapids SSE42 AVX F16C AVX2 AMX_TILE AMX_INT8)
    endif()
elseif (CPU)
    add_variant_impl("")
endif()
"""
DROP_AMX = b"""--- a/CMakeLists.txt
+++ b/CMakeLists.txt
@@ -2,8 +2,5 @@ if (ALL_VARIANTS)
     add_variant(skylakex     SSE42 AVX F16C AVX2 BMI2 FMA AVX512)
     add_variant(alderlake    SSE42 AVX F16C AVX2 BMI2 FMA AVX_VNNI)
-    if (NOT MSVC)
-        add_variant(sapphirerapids SSE42 AVX F16C AVX2 AMX_TILE AMX_INT8)
-    endif()
 elseif (CPU)
     add_variant_impl("")
 endif()
"""
# upstream: the block one level deeper, and what follows it rewritten
NESTED = ("if (X86)\n" + "".join("    " + x + "\n" for x in BLOCK.splitlines()[:6])
          + "    elseif (ARCH STREQUAL \"ARM\")\n        add_arm()\n    endif()\nendif()\n")


def test_a_deletion_goes_where_its_lines_are_as_they_were_without_the_context_upstream_rewrote():
    done = translate(hunk(DROP_AMX), NESTED.encode(), 2)
    assert done is not None and done.left_out == 3
    assert done.data.decode() == NESTED.replace(
        "        if (NOT MSVC)\n"
        "            add_variant(sapphirerapids SSE42 AVX F16C AVX2 AMX_TILE AMX_INT8)\n"
        "        endif()\n", "")


def test_a_deletion_without_its_context_needs_its_lines_only_once_in_the_file():
    far = "".join(f"set(V{i} {i})\n" for i in range(100))  # the other copy out of reach
    twice = NESTED + far + NESTED.replace("X86", "X64")
    assert translate(hunk(DROP_AMX), twice.encode(), 2) is None
