"""The line merge (portkit/follow/text.py): git's three-way merge of one file, and the conflicts it
leaves that the text itself orders. Each rule has a case where it settles the block and one
where it must not."""

from __future__ import annotations

from portkit.follow.text import (
    ALREADY,
    APART,
    BESIDE,
    COUNT,
    DELETED,
    EDITED,
    LAYOUT,
    SAME_POINT,
    WORDS,
    _apart,
    merge,
    merge3,
)

BASE = b"".join(b"line %d\n" % i for i in range(1, 13))


def lines(*numbers: int | bytes) -> bytes:
    return b"".join(n if isinstance(n, bytes) else b"line %d\n" % n for n in numbers)


def test_git_merges_what_does_not_touch():
    ours = BASE.replace(b"line 2\n", b"line two\n")
    theirs = BASE.replace(b"line 10\n", b"line ten\n")
    done = merge(ours, BASE, theirs)
    assert done.conflicts == 0 and not done.settled
    assert done.data == ours.replace(b"line 10\n", b"line ten\n")
    assert merge3(ours, BASE, theirs) == (done.data, 0)  # git's own result, untouched


def test_beside_an_insertion_right_after_lines_upstream_rewrote_stays_after_them():
    """The patch inserts after line 5; upstream rewrote lines 6-8 (git: a conflict)."""
    ours = lines(1, 2, 3, 4, 5, b"six\n", b"seven\n", b"eight\n", 9, 10, 11, 12)
    theirs = lines(1, 2, 3, 4, 5, b"added\n", 6, 7, 8, 9, 10, 11, 12)
    assert merge3(ours, BASE, theirs)[1] == 1
    done = merge(ours, BASE, theirs)
    assert done.conflicts == 0 and done.settled == (BESIDE,)
    assert done.data == lines(1, 2, 3, 4, 5, b"added\n", b"six\n", b"seven\n", b"eight\n",
                              9, 10, 11, 12)


def test_beside_an_insertion_right_before_lines_upstream_rewrote_stays_before_them():
    """Upstream inserted right after the lines the patch rewrites: upstream's lines follow."""
    ours = lines(1, 2, 3, 4, 5, 6, b"upstream\n", 7, 8, 9, 10, 11, 12)
    theirs = lines(1, 2, 3, 4, 5, b"SIX\n", 7, 8, 9, 10, 11, 12)
    done = merge(ours, BASE, theirs)
    assert done.conflicts == 0 and done.settled == (BESIDE,)
    assert done.data == lines(1, 2, 3, 4, 5, b"SIX\n", b"upstream\n", 7, 8, 9, 10, 11, 12)


def test_beside_is_not_an_insertion_inside_what_upstream_rewrote():
    """The patch inserts between two lines upstream rewrote: no side to keep it on."""
    ours = lines(1, 2, 3, 4, 5, b"six\n", b"seven\n", 8, 9, 10, 11, 12)
    theirs = lines(1, 2, 3, 4, 5, 6, b"added\n", 7, 8, 9, 10, 11, 12)
    done = merge(ours, BASE, theirs)
    assert done.conflicts == 1 and not done.settled
    assert b"<<<<<<< target" in done.data


def test_same_point_upstreams_lines_stay_after_the_line_they_follow_the_patchs_come_next():
    ours = lines(1, 2, 3, 4, 5, 6, b"upstream\n", 7, 8, 9, 10, 11, 12)
    theirs = lines(1, 2, 3, 4, 5, 6, b"patch\n", 7, 8, 9, 10, 11, 12)
    done = merge(ours, BASE, theirs)
    assert done.conflicts == 0 and done.settled == (SAME_POINT,)
    assert done.data == lines(1, 2, 3, 4, 5, 6, b"upstream\n", b"patch\n", 7, 8, 9, 10, 11,
                              12)


ENUM = b"".join(b"    LLM_TYPE_%dB,\n" % n for n in (1, 3, 7, 13, 20, 30, 34, 40, 65, 70))


def _inserted(after: bytes, line: bytes) -> bytes:
    return ENUM.replace(after, after + line)


def test_same_point_the_patchs_lines_go_first_where_that_keeps_a_sorted_list_in_order():
    """The patch adds 22B after 20B, upstream 27B there: 20B, 22B, 27B, 30B is the
    list's order; 20B, 27B, 22B would break it."""
    ours = _inserted(b"    LLM_TYPE_20B,\n", b"    LLM_TYPE_27B,\n")
    theirs = _inserted(b"    LLM_TYPE_20B,\n", b"    LLM_TYPE_22B,\n")
    done = merge(ours, ENUM, theirs)
    assert done.conflicts == 0 and done.settled == (SAME_POINT,)
    assert done.data == _inserted(b"    LLM_TYPE_20B,\n",
                                  b"    LLM_TYPE_22B,\n    LLM_TYPE_27B,\n")


def test_same_point_upstreams_lines_first_where_that_is_the_sorted_lists_order():
    """Upstream adds 22B after 20B, the patch 27B there: upstream's first keeps the order."""
    ours = _inserted(b"    LLM_TYPE_20B,\n", b"    LLM_TYPE_22B,\n")
    theirs = _inserted(b"    LLM_TYPE_20B,\n", b"    LLM_TYPE_27B,\n")
    done = merge(ours, ENUM, theirs)
    assert done.data == _inserted(b"    LLM_TYPE_20B,\n",
                                  b"    LLM_TYPE_22B,\n    LLM_TYPE_27B,\n")


def test_same_point_a_list_not_in_order_has_upstreams_lines_first():
    """Entries appended as they came (an arch table): the patch's after upstream's."""
    table = b"".join(b"    { LLM_ARCH_%s },\n" % n for n in
                     (b"LLAMA", b"FALCON", b"PHI2", b"GEMMA", b"PLM", b"UNKNOWN"))
    ours = table.replace(b"PLM },\n", b"PLM },\n    { LLM_ARCH_BAILINGMOE },\n")
    theirs = table.replace(b"PLM },\n", b"PLM },\n    { LLM_ARCH_MISTRAL3 },\n")
    done = merge(ours, table, theirs)
    assert done.data == table.replace(
        b"PLM },\n", b"PLM },\n    { LLM_ARCH_BAILINGMOE },\n    { LLM_ARCH_MISTRAL3 },\n")


FUNC = (b"buffer * alloc(type * t, size_t size) {\n", b"    if (size == 0) {\n",
        b"        return dummy(t);\n", b"    }\n", b"\n", b"    return t->alloc(t, size);\n",
        b"}\n", b"\n", b"size_t align(type * t) {\n", b"    return t->align(t);\n", b"}\n")
GUARD = b"    GGML_ASSERT(t);\n"
BLOCK = (b"    if (t->no_alloc) {\n", b"        return noalloc(t, size);\n", b"    }\n", b"\n")


def _at_return(*inserted: bytes) -> bytes:
    return b"".join(FUNC[:5] + inserted + FUNC[5:])


def test_same_point_a_paragraph_of_the_patch_goes_before_upstream_lines_leading_into_the_next():
    """Upstream put a guard right before the statement it guards (a blank line above it, none
    below); the patch put a paragraph of its own there, ended by a blank line. Patch's lines
    after upstream's would part the guard from its statement: they go before it."""
    done = merge(_at_return(GUARD), _at_return(), _at_return(*BLOCK))
    assert done.conflicts == 0 and done.settled == (SAME_POINT,)
    assert done.data == _at_return(*BLOCK, GUARD)


def test_same_point_lines_the_patch_runs_into_the_next_line_come_after_upstreams():
    """Both sides' lines run into the statement after them: upstream's stay first."""
    patch_line = b"    count++;\n"
    done = merge(_at_return(GUARD), _at_return(), _at_return(patch_line))
    assert done.settled == (SAME_POINT,)
    assert done.data == _at_return(GUARD, patch_line)


def test_same_point_upstreams_lines_that_end_the_paragraph_above_stay_first():
    """Upstream's line follows the line above it with no blank between: it ends that
    paragraph, and the patch's paragraph comes after it."""
    base = b"".join(FUNC[:4] + FUNC[5:])  # no blank line between the if block and return
    ours = b"".join(FUNC[:4] + (GUARD,) + FUNC[5:])
    theirs = b"".join(FUNC[:4] + BLOCK + FUNC[5:])
    done = merge(ours, base, theirs)
    assert done.settled == (SAME_POINT,)
    assert done.data == b"".join(FUNC[:4] + (GUARD,) + BLOCK + FUNC[5:])


def test_same_point_is_not_two_rewrites_of_one_line():
    ours = BASE.replace(b"line 6\n", b"upstream six\n")
    theirs = BASE.replace(b"line 6\n", b"patch six\n")
    done = merge(ours, BASE, theirs)
    assert done.conflicts == 1 and not done.settled


def test_already_what_the_patch_inserts_is_in_the_target_side_of_the_block():
    """Upstream took the patch's line and added one of its own beside it."""
    ours = lines(1, 2, 3, 4, 5, 6, b"upstream\n", b"patch\n", 7, 8, 9, 10, 11, 12)
    theirs = lines(1, 2, 3, 4, 5, 6, b"patch\n", 7, 8, 9, 10, 11, 12)
    done = merge(ours, BASE, theirs)
    assert done.conflicts == 0 and done.settled == (ALREADY,)
    assert done.data == ours  # nothing inserted twice


def test_already_is_not_a_line_that_is_merely_alike():
    ours = lines(1, 2, 3, 4, 5, 6, b"upstream\n", b"patch!\n", 7, 8, 9, 10, 11, 12)
    theirs = lines(1, 2, 3, 4, 5, 6, b"patch\n", 7, 8, 9, 10, 11, 12)
    done = merge(ours, BASE, theirs)
    assert done.settled == (SAME_POINT,)
    assert done.data.count(b"patch") == 2


def test_apart_a_rewrite_that_ends_where_upstreams_begins_is_made_with_it():
    """The patch rewrites lines 5 and 6; upstream rewrote line 7 and inserted before it:
    git stops (the changes touch), but each changed its own lines: both are made."""
    ours = lines(1, 2, 3, 4, 5, 6, b"upstream new\n", b"upstream seven\n", 8, 9, 10, 11, 12)
    theirs = lines(1, 2, 3, 4, b"patch five\n", b"patch six\n", 7, 8, 9, 10, 11, 12)
    done = merge(ours, BASE, theirs)
    assert done.conflicts == 0 and done.settled == (APART,)
    assert done.data == lines(1, 2, 3, 4, b"patch five\n", b"patch six\n", b"upstream new\n",
                              b"upstream seven\n", 8, 9, 10, 11, 12)


def test_apart_is_not_an_insertion_at_the_edge_of_the_other_sides_rewrite():
    """The patch inserts a line right after line 6 and rewrites line 5; upstream rewrote
    line 7: where the insertion goes against upstream's rewrite of 7 is a choice: it is
    not made by `apart` (the insertion's own rule may still order it)."""
    base = [b"five\n", b"six\n", b"seven\n"]
    ours = [b"five\n", b"six\n", b"SEVEN\n"]
    theirs = [b"FIVE\n", b"six\n", b"inserted\n", b"seven\n"]
    assert _apart(ours, base, theirs) is None


AMX = lines(1, 2, 3, b"    if (NOT MSVC)\n", b"        variant(sapphirerapids AVX F16C FMA AMX)\n",
            b"    endif()\n", b"else ()\n", 8, 9, 10, 11, 12)


def test_deleted_lines_the_patch_deletes_beside_a_line_upstream_rewrote_are_deleted():
    """The patch deletes the AMX block; upstream rewrote the line right after it (git: a
    conflict): the block goes, upstream's line stays."""
    ours = AMX.replace(b"else ()\n", b"elseif (GGML_CPU)\n")
    theirs = AMX.replace(b"    if (NOT MSVC)\n        variant(sapphirerapids AVX F16C FMA AMX)\n"
                         b"    endif()\n", b"")
    assert merge3(ours, AMX, theirs)[1] == 1
    done = merge(ours, AMX, theirs)
    assert done.conflicts == 0 and done.settled == (DELETED,)
    assert done.data == theirs.replace(b"else ()\n", b"elseif (GGML_CPU)\n")


def test_deleted_is_not_a_deletion_of_lines_upstream_rewrote():
    """Upstream rewrote the very lines the patch deletes, beyond alike: a conflict."""
    ours = AMX.replace(b"variant(sapphirerapids AVX F16C FMA AMX)",
                       b"add_amx_variants(ALL)").replace(b"    if (NOT MSVC)\n", b"    if (1)\n")
    theirs = AMX.replace(b"    if (NOT MSVC)\n        variant(sapphirerapids AVX F16C FMA AMX)\n"
                         b"    endif()\n", b"")
    done = merge(ours, AMX, theirs)
    assert done.conflicts == 1 and not done.settled


def test_edited_lines_the_patch_deletes_go_as_upstream_edited_them():
    """Upstream added BMI2 to every variant line, the one the patch deletes among them: the
    patch's deletion takes upstream's edited lines, upstream's other edits stay."""
    ours = AMX.replace(b"AVX F16C FMA", b"AVX F16C BMI2 FMA").replace(b"line 3\n",
                                                                    b"line 3 BMI2\n")
    theirs = AMX.replace(b"    if (NOT MSVC)\n        variant(sapphirerapids AVX F16C FMA AMX)\n"
                         b"    endif()\n", b"")
    assert merge3(ours, AMX, theirs)[1] == 1
    done = merge(ours, AMX, theirs)
    assert done.conflicts == 0 and done.settled == (EDITED,)
    assert done.data == theirs.replace(b"line 3\n", b"line 3 BMI2\n")


def test_edited_is_not_upstream_deleting_lines_the_patch_edited():
    """The other way round, the patch's edit would be lost: a conflict."""
    theirs = AMX.replace(b"AVX F16C FMA", b"AVX F16C BMI2 FMA").replace(b"line 3\n",
                                                                      b"line 3 BMI2\n")
    ours = AMX.replace(b"    if (NOT MSVC)\n        variant(sapphirerapids AVX F16C FMA AMX)\n"
                       b"    endif()\n", b"")
    done = merge(ours, AMX, theirs)
    assert done.conflicts == 1 and not done.settled


CHARSMAP = lines(1, 2, b"    size_t n = gguf_get_arr_n(ctx, keyidx);\n", 4, 5, 6)


def test_words_a_name_the_patch_renames_in_a_line_upstream_extended_is_merged_word_by_word():
    """The patch renames the call; upstream made the variable const and checked the type on
    a line before it (git: a conflict, both changed that line): each keeps its words."""
    ours = CHARSMAP.replace(b"    size_t n = gguf_get_arr_n(ctx, keyidx);\n",
                            b"    check_type(ctx, keyidx);\n"
                            b"    const size_t n = gguf_get_arr_n(ctx, keyidx);\n")
    theirs = CHARSMAP.replace(b"gguf_get_arr_n(", b"gguf_get_arr_data_n(")
    assert merge3(ours, CHARSMAP, theirs)[1] == 1
    done = merge(ours, CHARSMAP, theirs)
    assert done.conflicts == 0 and done.settled == (WORDS,)
    assert done.data == ours.replace(b"gguf_get_arr_n(", b"gguf_get_arr_data_n(")


def test_words_is_not_two_changes_of_one_word():
    ours = CHARSMAP.replace(b"gguf_get_arr_n(", b"gguf_get_arr_count(")
    theirs = CHARSMAP.replace(b"gguf_get_arr_n(", b"gguf_get_arr_data_n(")
    done = merge(ours, CHARSMAP, theirs)
    assert done.conflicts == 1 and not done.settled


NAMES = (b"UPSCALE", b"PAD", b"PAD_REFLECT", b"ARANGE", b"ARGSORT", b"TOPK")


def _table(width: int, names=NAMES) -> bytes:
    """Kernel rows, their second column padded to `width` (upstream widens it for a longer
    name)."""
    return b"".join(b"    ADD_KERNEL(KERNEL_%s,%s%s, true);\n" % (n, b" " * (width - len(n)),
                                                               n.lower()) for n in names)


TABLE = _table(12)


def test_layout_a_row_the_patch_inserts_in_a_table_upstream_respaced_is_merged_blanks_aside():
    """Upstream widened the table's columns (every row re-spaced) and added a row at its end;
    the patch inserts a row in the middle: git stops, the blanks-blind merge does not."""
    ours = _table(16, (*NAMES, b"LONG_NAME_F32"))
    theirs = _table(12, (*NAMES[:3], b"UNPAD", *NAMES[3:]))
    assert merge3(ours, TABLE, theirs)[1] == 1
    done = merge(ours, TABLE, theirs)
    assert done.conflicts == 0 and done.settled == (LAYOUT,)
    rows = done.data.splitlines(keepends=True)
    kept = ours.splitlines(keepends=True)
    # upstream's rows as upstream spaced them, the patch's own as the patch wrote it
    assert rows == kept[:3] + [b"    ADD_KERNEL(KERNEL_UNPAD,       unpad, true);\n"] + kept[3:]


def test_layout_is_not_upstream_rewriting_the_row_the_patch_changes():
    """Upstream re-spaced the table and renamed the name the patch renames: a conflict."""
    ours = _table(16).replace(b"pad_reflect,", b"pad_reflect_1d,")
    theirs = TABLE.replace(b"pad_reflect,", b"pad_mirror,")
    done = merge(ours, TABLE, theirs)
    assert done.conflicts == 1 and LAYOUT not in done.settled


def test_layout_needs_upstream_to_have_respaced_lines():
    """No line of upstream's side is a base line re-spaced: blanks are not what stopped git,
    and the block stays a conflict (for structure, or a human)."""
    base = lines(1, 2, 3, 4, 5, 6)
    ours = lines(1, 2, b"three\n", b"four\n", 5, 6)
    theirs = lines(1, 2, 3, b"added\n", 4, 5, 6)
    done = merge(ours, base, theirs)
    assert done.conflicts == 1 and not done.settled


ASSERT = b'static_assert(GGML_OP_COUNT == %d, "GGML_OP_COUNT != %d");\n'


def _ops(count: int, *names: bytes) -> bytes:
    return b"".join(b'    "%s",\n' % n for n in names) + b"};\n\n" + ASSERT % (count, count) \
        + b"\nstatic const int after = 1;\n"


def test_count_the_patch_raises_where_upstream_lowered_it_is_upstreams_raised():
    """Upstream removed two operators (83 -> 81); the patch adds one (83 -> 84): the tree
    with both has 82, and the assertion says so."""
    base = _ops(83, b"PAD", b"ARANGE", b"OLD_A", b"OLD_B")
    ours = _ops(81, b"PAD", b"ARANGE")
    theirs = _ops(84, b"PAD", b"ARANGE", b"OLD_A", b"OLD_B", b"UNPAD")
    done = merge(ours, base, theirs)
    assert done.conflicts == 0 and COUNT in done.settled
    assert ASSERT % (82, 82) in done.data and b"UNPAD" in done.data


def test_count_is_not_a_line_the_patch_changes_otherwise():
    """The patch lowers the count (an operator removed): no raise to carry, a conflict."""
    base = _ops(83, b"PAD", b"ARANGE", b"OLD_A", b"OLD_B")
    ours = _ops(81, b"PAD", b"ARANGE", b"OLD_A", b"OLD_B")
    theirs = _ops(82, b"PAD", b"ARANGE", b"OLD_A")
    done = merge(ours, base, theirs)
    assert COUNT not in done.settled


def test_same_point_the_patchs_paragraph_and_upstreams_share_one_blank_line():
    """Upstream opened a paragraph of its own (a blank line, then a guard) before the
    statement; the patch's lines end with a blank line: one blank line between them."""
    base = b"int f() {\n    a();\n    stmt();\n}\n"
    ours = base.replace(b"    stmt();\n", b"\n    if (x)\n    stmt();\n")
    theirs = base.replace(b"    stmt();\n", b"    c();\n\n    stmt();\n")
    done = merge(ours, base, theirs)
    assert done.settled == (SAME_POINT,)
    assert done.data == b"int f() {\n    a();\n    c();\n\n    if (x)\n    stmt();\n}\n"
