"""portkit.follow.repeats: a case or an enumerator a carried patch would write a second time
into a switch or an enum that has it (upstream took the same support) is left out; anything
else is left as carried."""

from __future__ import annotations

from portkit.follow.repeats import repeated

# The target: upstream supports GEMMA3 already, with a real body.
OURS = b"""enum llm_arch {
    LLM_ARCH_GEMMA2,
    LLM_ARCH_GEMMA3,
    LLM_ARCH_STARCODER2,
};

void load(int arch) {
    switch (arch) {
        case LLM_ARCH_GEMMA2:
            {
                g2();
            } break;
        case LLM_ARCH_GEMMA3:
            {
                g3();
            } break;
        case LLM_ARCH_STARCODER2:
            {
                sc2();
            } break;
        default: break;
    }
}

int rope(int arch) {
    switch (arch) {
        case LLM_ARCH_GEMMA:
        case LLM_ARCH_GEMMA2:
        case LLM_ARCH_STARCODER2:
        case LLM_ARCH_GEMMA3:
            return 1;
        default:
            return 0;
    }
}
"""

STUB = b"""        case LLM_ARCH_GEMMA3:
            {
            } break;
"""


def _with(text: bytes, after: bytes, lines: bytes) -> bytes:
    assert text.count(after) == 1
    return text.replace(after, after + lines)


def test_a_case_the_switch_has_already_is_left_out_and_said():
    # git's merge put the patch's stub (written when upstream had no GEMMA3) after GEMMA2's
    carried = _with(OURS, b"                g2();\n            } break;\n", STUB)
    out, notes = repeated(OURS, carried, STUB.decode().splitlines(keepends=True))
    assert out == OURS
    assert notes == ["case LLM_ARCH_GEMMA3 is in that switch already (line 13): the patch's, "
                     "a second one, left out (it would not compile)"]


def test_a_fall_through_label_twice_keeps_upstreams_place():
    line = b"        case LLM_ARCH_GEMMA3:\n"
    carried = _with(OURS, b"        case LLM_ARCH_GEMMA:\n", line)  # rope(): the patch's spot
    out, notes = repeated(OURS, carried, [line.decode()])
    assert out == OURS and len(notes) == 1


def test_an_enumerator_the_enum_has_already_is_left_out():
    line = b"    LLM_ARCH_GEMMA3,\n"
    carried = _with(OURS, b"    LLM_ARCH_STARCODER2,\n", line)
    out, notes = repeated(OURS, carried, [line.decode()])
    assert out == OURS
    assert notes[0].startswith("LLM_ARCH_GEMMA3 is in that enum already (line 3)")


def test_a_new_case_and_the_rest_of_the_patch_stay():
    other = b"""        case LLM_ARCH_SOLAR:
            {
            } break;
"""
    carried = _with(OURS, b"                g2();\n            } break;\n", STUB + other)
    out, notes = repeated(OURS, carried, (STUB + other).decode().splitlines(keepends=True))
    assert out == _with(OURS, b"                g2();\n            } break;\n", other)
    assert len(notes) == 1


def test_the_same_label_in_another_switch_is_not_a_repeat():
    ours = OURS.replace(b"        case LLM_ARCH_GEMMA3:\n            {\n                g3();\n"
                        b"            } break;\n", b"")
    carried = _with(ours, b"                g2();\n            } break;\n", STUB)
    assert repeated(ours, carried, STUB.decode().splitlines(keepends=True)) == (carried, [])


def test_a_case_upstream_has_under_a_preprocessor_condition_is_not_compared():
    ours = OURS.replace(b"        case LLM_ARCH_GEMMA3:\n            {\n                g3();\n"
                        b"            } break;\n",
                        b"#ifdef GGML_USE_G3\n        case LLM_ARCH_GEMMA3:\n            {\n"
                        b"                g3();\n            } break;\n#endif\n")
    carried = _with(ours, b"                g2();\n            } break;\n", STUB)
    assert repeated(ours, carried, STUB.decode().splitlines(keepends=True)) == (carried, [])


def test_a_repeat_the_target_had_already_is_not_the_patchs():
    # the target itself repeats a label (it does not compile as it is): not for the carry to mend
    ours = _with(OURS, b"                g2();\n            } break;\n", STUB)
    carried = _with(ours, b"    LLM_ARCH_GEMMA2,\n", b"    LLM_ARCH_SOLAR,\n")
    assert repeated(ours, carried, ["    LLM_ARCH_SOLAR,\n"]) == (carried, [])


def test_a_case_sharing_its_lines_with_other_code_is_left_as_carried():
    # the patch's label and a statement of upstream's on one line: not a whole label to remove
    carried = OURS.replace(b"                g2();\n            } break;\n",
                           b"                g2();\n            } break; case LLM_ARCH_GEMMA3: {"
                           b" } break;\n")
    added = ["            } break; case LLM_ARCH_GEMMA3: { } break;\n"]
    out, notes = repeated(OURS, carried, added)
    assert (out, notes) == (carried, [])


def test_a_file_tree_sitter_cannot_read_is_left_as_carried():
    carried = _with(OURS, b"                g2();\n            } break;\n", STUB) + b"}}}\n"
    assert repeated(OURS, carried, STUB.decode().splitlines(keepends=True)) == (carried, [])


def test_the_same_empty_label_twice_is_told_apart_by_the_line_diff():
    ours = OURS.replace(b"        case LLM_ARCH_STARCODER2:\n        case LLM_ARCH_GEMMA3:\n",
                        b"        case LLM_ARCH_GEMMA3:\n        case LLM_ARCH_STARCODER2:\n")
    line = b"        case LLM_ARCH_GEMMA3:\n"
    carried = _with(ours, b"        case LLM_ARCH_GEMMA:\n", line)
    assert carried.count(line) == 3  # load()'s, and rope()'s twice
    out, notes = repeated(ours, carried, [line.decode()])
    assert out == ours and len(notes) == 1


def test_a_repeat_with_code_of_its_own_stays_and_is_said():
    """The fork's own implementation against upstream's: leaving it out would lose it, keeping
    both does not compile. It stays as carried, and the note says the two must become one."""
    mine = b"        case LLM_ARCH_GEMMA3:\n            {\n                fork_g3();\n" \
           b"            } break;\n"
    carried = _with(OURS, b"                g2();\n            } break;\n", mine)
    out, notes = repeated(OURS, carried, mine.decode().splitlines(keepends=True))
    assert out == carried
    assert notes == ["case LLM_ARCH_GEMMA3 is in that switch already (line 17): the patch's, "
                     "in its own form, carried beside it: twice, it does not compile (the two "
                     "must become one)"]


def test_a_one_line_case_with_code_of_its_own_stays():
    mine = b"        case LLM_ARCH_GEMMA3: fork_g3(); break;\n"
    carried = _with(OURS, b"                g2();\n            } break;\n", mine)
    out, notes = repeated(OURS, carried, [mine.decode()])
    assert out == carried and "in its own form" in notes[0]


def test_an_enumerator_with_a_value_of_its_own_stays():
    line = b"    LLM_ARCH_GEMMA3 = 40,\n"
    carried = _with(OURS, b"    LLM_ARCH_STARCODER2,\n", line)
    out, notes = repeated(OURS, carried, [line.decode()])
    assert out == carried and "in its own form" in notes[0]


# A name table and a table of tables, as llama-arch.cpp has them; upstream has GEMMA3 in both.
TABLES = b"""static const std::map<llm_arch, const char *> LLM_ARCH_NAMES = {
    { LLM_ARCH_GEMMA2,           "gemma2"           },
    { LLM_ARCH_GEMMA3,           "gemma3"           },
    { LLM_ARCH_STARCODER2,       "starcoder2"       },
};

static const std::map<llm_arch, std::map<llm_tensor, const char *>> LLM_TENSOR_NAMES = {
    {
        LLM_ARCH_GEMMA2,
        {
            { LLM_TENSOR_TOKEN_EMBD, "token_embd" },
        },
    },
    {
        LLM_ARCH_GEMMA3,
        {
            { LLM_TENSOR_TOKEN_EMBD, "token_embd" },
            { LLM_TENSOR_OUTPUT,     "output" },
        },
    },
};
"""
GEMMA3_TENSORS = b"""    {
        LLM_ARCH_GEMMA3,
        {
            { LLM_TENSOR_TOKEN_EMBD,      "token_embd" },
        },
    },
"""
AFTER_GEMMA2 = b"""            { LLM_TENSOR_TOKEN_EMBD, "token_embd" },
        },
    },
"""


def test_a_key_the_map_has_already_with_nothing_of_its_own_is_left_out_and_said():
    """The patch's entries for GEMMA3 (written when upstream had none): upstream's entries
    have every line of them. A second key compiles, but the map keeps only one: the patch's
    says nothing upstream's does not, and is left out."""
    line = b'    { LLM_ARCH_GEMMA3,  "gemma3" },\n'
    carried = _with(_with(TABLES, b'"gemma2"           },\n', line), AFTER_GEMMA2,
                    GEMMA3_TENSORS)
    added = (line + GEMMA3_TENSORS).decode().splitlines(keepends=True)
    out, notes = repeated(TABLES, carried, added)
    assert out == TABLES
    assert notes == [
        "LLM_ARCH_GEMMA3 is a key of that map already (line 3): the patch's, a second one, "
        "left out (the map keeps one of them)",
        "LLM_ARCH_GEMMA3 is a key of that map already (line 15): the patch's, a second one, "
        "left out (the map keeps one of them)"]


def test_a_key_the_map_has_already_with_a_value_of_its_own_stays_and_is_said():
    line = b'    { LLM_ARCH_GEMMA3,           "gemma-3"          },\n'
    carried = _with(TABLES, b'"gemma2"           },\n', line)
    out, notes = repeated(TABLES, carried, [line.decode()])
    assert out == carried
    assert notes == ["LLM_ARCH_GEMMA3 is a key of that map already (line 4): the patch's, in "
                     "its own form, carried beside it: the map keeps only one of them (the two "
                     "must become one)"]


def test_a_new_key_in_a_map_is_not_a_repeat():
    line = b'    { LLM_ARCH_SOLAR,            "solar"            },\n'
    carried = _with(TABLES, b'"gemma2"           },\n', line)
    assert repeated(TABLES, carried, [line.decode()]) == (carried, [])


def test_a_key_twice_in_a_multimap_is_no_repeat():
    table = TABLES.replace(b"std::map<llm_arch, const char *>", b"std::multimap<llm_arch, "
                           b"const char *>")
    line = b'    { LLM_ARCH_GEMMA3,           "gemma3"           },\n'
    carried = _with(table, b'"gemma2"           },\n', line)
    assert repeated(table, carried, [line.decode()]) == (carried, [])


def test_only_the_outermost_type_makes_a_map():
    """A multimap of maps, a list of pairs holding maps: a key twice is their own business."""
    line = b'    { LLM_ARCH_GEMMA3,           "gemma3"           },\n'
    for kind in (b"std::multimap<llm_arch, std::map<int, int>>",
                 b"std::vector<std::pair<llm_arch, std::map<int, int>>>"):
        table = TABLES.replace(b"std::map<llm_arch, const char *>", kind)
        carried = _with(table, b'"gemma2"           },\n', line)
        assert repeated(table, carried, [line.decode()]) == (carried, []), kind


def test_with_once_only_a_label_the_file_has_once_is_a_candidate():
    """drift's cheaper look (`once`): a key the file has in every inner table of a table of
    tables is not read for, nor a case two switches have; a case the file has once is."""
    from portkit.follow.repeats import _candidates
    tables = (b"static const std::map<int, std::map<int, const char *>> T = {\n"
              b"    { 1, { { LLM_TENSOR_OUT, \"a\" }, } },\n"
              b"    { 2, { { LLM_TENSOR_OUT, \"b\" }, } },\n};\n")
    entry = ["        { LLM_TENSOR_OUT, \"c\" },\n"]
    assert _candidates(tables, entry) and not _candidates(tables, entry, once=True)
    gemma3 = ["        case LLM_ARCH_GEMMA3:\n"]
    assert _candidates(OURS, gemma3) and not _candidates(OURS, gemma3, once=True)
    assert _candidates(OURS, ["        case LLM_ARCH_GEMMA:\n"], once=True)
