"""Marked sections (vlens.utils.marked_sections): one command writes a section, others keep it."""

import pytest

from vlens.utils.errors import UserInputError
from vlens.utils.marked_sections import marked_sections, replace_marked_section, section_markers


def test_markers_spell_the_name_and_refuse_a_name_that_would_break_them():
    assert section_markers("interventions-study") == (
        "<!-- vlens:interventions-study -->", "<!-- /vlens:interventions-study -->")
    with pytest.raises(UserInputError, match="letters, digits"):
        section_markers("two words")


def test_replace_keeps_every_character_outside_the_section():
    text = "# card\n\nintro\n<!-- vlens:s -->\nold\nlines\n<!-- /vlens:s -->\n\n## after\ntail"
    new = replace_marked_section(text, "s", "\nnew body\n\n")
    assert new == "# card\n\nintro\n<!-- vlens:s -->\nnew body\n<!-- /vlens:s -->\n\n## after\ntail"
    assert replace_marked_section(new, "s", "new body") == new  # idempotent


def test_a_missing_section_is_appended_after_a_blank_line_or_refused():
    assert replace_marked_section("", "s", "b") == "<!-- vlens:s -->\nb\n<!-- /vlens:s -->\n"
    assert replace_marked_section("# t\n\n\n", "s", "b") == "# t\n\n<!-- vlens:s -->\nb\n<!-- /vlens:s -->\n"
    with pytest.raises(UserInputError, match=r"needs the lines <!-- vlens:s --> and <!-- /vlens:s -->"):
        replace_marked_section("# t\n", "s", "b", append_if_missing=False)


def test_an_opening_marker_without_its_closing_one_is_not_a_section():
    text = "<!-- vlens:s -->\nhalf"
    assert marked_sections(text) == []
    assert replace_marked_section(text, "s", "b").endswith("half\n\n<!-- vlens:s -->\nb\n<!-- /vlens:s -->\n")


def test_marked_sections_finds_each_section_by_its_own_name_in_order():
    text = ("a <!-- vlens:x -->1<!-- /vlens:y --> <!-- /vlens:x --> b\n"
            "<!-- vlens:y-2 -->\n2\n<!-- /vlens:y-2 -->")
    assert marked_sections(text) == ["<!-- vlens:x -->1<!-- /vlens:y --> <!-- /vlens:x -->",
                                     "<!-- vlens:y-2 -->\n2\n<!-- /vlens:y-2 -->"]


def test_the_commands_that_write_sections_use_these_markers():
    from vlens.recipes.embedded.claims import README_BEGIN, README_SECTION
    from vlens.studies.interventions import CARD_BEGIN, CARD_SECTION

    assert (CARD_BEGIN, README_BEGIN) == (section_markers(CARD_SECTION)[0], section_markers(README_SECTION)[0])
