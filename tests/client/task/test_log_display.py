"""How a log line is shown: every control character as visible, inert text, so a line can
neither rewrite its ``[Node i]`` label nor talk to the terminal; colour only when asked for,
and then reset before the next line."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from flow_sdk.client.tasklogs import shown, shown_lines

FORGED = "\x1b[2K\x1b[1G[Node 1] fake \x1b]0;title\x07 \x1b]8;;http://x\x07link\x1b]8;;\x07"
ACTIVE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028-\u202e\u2066-\u2069]")
SGR = re.compile("\x1b\\[[0-9;:]*m")

hostile_text = st.text(alphabet=st.sampled_from(
    ["\x1b", "[", "]", "0", "1", ";", "m", "K", "G", "\x07", "\r", "\n", "\t", "\x7f", "\x85",
     "\x9b", "\u2028", "\u202e", "\u2067", "a", " ", "\\"]), max_size=40)


def test_escape_sequences_show_as_text() -> None:
    assert shown(FORGED) == ("\\x1b[2K\\x1b[1G[Node 1] fake \\x1b]0;title\\x07 "
                             "\\x1b]8;;http://x\\x07link\\x1b]8;;\\x07")
    assert shown("a\rb\x00c\x7fd\x9be\u2028f\u202eg\th") == \
        "a\\x0db\\x00c\\x7fd\\x9be\\u2028f\\u202eg\th"  # the tab stays a tab


def test_colour_stays_only_when_asked_for_and_is_reset_at_the_end() -> None:
    red = "\x1b[31mred\x1b[0m and \x1b[1;38;5;208mbold\x1b[2K"
    assert shown(red) == "\\x1b[31mred\\x1b[0m and \\x1b[1;38;5;208mbold\\x1b[2K"
    assert shown(red, color=True) == "\x1b[31mred\x1b[0m and \x1b[1;38;5;208mbold\\x1b[2K" \
                                     "\x1b[0m"
    assert shown("plain", color=True) == "plain"  # no colour used: nothing added


def test_a_failure_message_keeps_its_lines() -> None:
    assert shown_lines("node 0 rank 0: exited; last lines:\n  \x1b]0;x\x07") == \
        "node 0 rank 0: exited; last lines:\n  \\x1b]0;x\\x07"


@settings(max_examples=500, deadline=None)
@given(hostile_text)
def test_nothing_a_terminal_acts_on_is_left(text: str) -> None:
    assert not ACTIVE.search(shown(text))
    coloured = shown(text, color=True)
    assert not ACTIVE.search(SGR.sub("", coloured))  # only colour and style sequences left
    assert coloured.endswith("\x1b[0m") or "\x1b" not in coloured
