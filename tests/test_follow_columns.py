"""Columns (portkit.follow.columns): a line the patch adds beside lines upstream respaced into
wider columns takes upstream's columns; nothing else is touched."""

from portkit.follow.columns import realign, repad

OLD_ROW = b'    { LLM_KV_ATTENTION_SCALE,             "%s.attention.scale"             },'
NEW_ROW = (b'    { LLM_KV_ATTENTION_SCALE,                   '
           b'"%s.attention.scale"                   },')
MINE = b'    { LLM_KV_ATTENTION_SKIP_CONN,         "%s.attention.skip_conn"         },'
OLD_DECL = b"    GGML_API size_t               sched_get_buffer_size(sched_t sched, int n);"
NEW_DECL = b"    GGML_API size_t                     sched_get_buffer_size(sched_t sched, int n);"
MINE_DECL = b"    GGML_API size_t               sched_get_attempted_size(sched_t sched, int n);"


def table(*rows: bytes) -> bytes:
    return b"static const map NAMES = {\n" + b"".join(r + b"\n" for r in rows) + b"};\n"


def test_repad_moves_the_fields_that_sat_in_the_old_columns_to_the_new_ones():
    assert repad(MINE, OLD_ROW, NEW_ROW) == (b'    { LLM_KV_ATTENTION_SKIP_CONN,               '
                                             b'"%s.attention.skip_conn"               },')


def test_repad_keeps_the_spacing_of_fields_that_were_not_in_a_column():
    """A declaration: the name moves with upstream's wider type column; the parameters,
    written with single spaces, keep them."""
    assert repad(MINE_DECL, OLD_DECL, NEW_DECL) == \
        b"    GGML_API size_t                     sched_get_attempted_size(sched_t sched, int n);"


def test_repad_is_nothing_for_a_line_not_in_the_old_columns():
    other = b"    { LLM_KV_X, \"%s.x\" },"
    assert repad(other, OLD_ROW, NEW_ROW) is None


def test_repad_is_nothing_where_a_field_would_not_fit():
    narrower = OLD_ROW.replace(b"             \"", b" \"", 1)  # upstream narrowed the column
    assert repad(MINE.replace(b"SKIP_CONN,  ", b"SKIP_CONNECTIONS"), OLD_ROW, narrower) is None


def test_repad_is_nothing_with_tabs_or_a_new_indentation():
    assert repad(MINE, OLD_ROW.replace(b"    {", b"\t{"), NEW_ROW.replace(b"    {", b"\t{")) is None
    assert repad(MINE, OLD_ROW, b"  " + NEW_ROW) is None


def test_realign_a_row_the_patch_adds_to_a_table_upstream_respaced():
    base = table(OLD_ROW)
    ours = table(NEW_ROW)
    result = table(NEW_ROW, MINE)
    out, count = realign(ours, base, result, [MINE.decode() + "\n"])
    assert count == 1
    assert out == table(NEW_ROW, repad(MINE, OLD_ROW, NEW_ROW) or b"")


def test_realign_nothing_where_upstream_changed_more_than_whitespace():
    base = table(OLD_ROW)
    ours = table(NEW_ROW.replace(b"attention.scale", b"attn.scale"))
    result = table(NEW_ROW.replace(b"attention.scale", b"attn.scale"), MINE)
    assert realign(ours, base, result, [MINE.decode()]) == (result, 0)


def test_realign_nothing_where_upstream_kept_the_columns():
    base = ours = table(OLD_ROW)
    result = table(OLD_ROW, MINE)
    assert realign(ours, base, result, [MINE.decode()]) == (result, 0)


def test_realign_nothing_across_a_blank_line():
    base = table(OLD_ROW)
    ours = table(NEW_ROW, b"")
    result = table(NEW_ROW, b"", MINE)
    assert realign(ours, base, result, [MINE.decode()]) == (result, 0)


def test_realign_only_the_lines_the_patch_adds():
    """A line upstream has in the old columns (not the patch's) stays as upstream wrote it."""
    base = table(OLD_ROW)
    ours = table(NEW_ROW, MINE)
    assert realign(ours, base, ours, [MINE.decode()]) == (ours, 0)


def test_realign_nothing_where_the_base_has_the_line_in_two_forms():
    """Which old columns the line had is not known: nothing is guessed."""
    base = table(OLD_ROW, OLD_ROW.replace(b"             \"", b"      \"", 1))
    ours = table(NEW_ROW, NEW_ROW)
    result = table(NEW_ROW, MINE, NEW_ROW)
    assert realign(ours, base, result, [MINE.decode()]) == (result, 0)
