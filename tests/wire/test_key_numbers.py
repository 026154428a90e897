"""Numbers in store keys are read by one total function: any text gives a number or None."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from flow_sdk import wire


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=24))
def test_any_text_is_a_number_or_none(text: str) -> None:
    number = wire.key_number(text)
    if number is None:
        assert not (text.isascii() and text.isdigit() and 0 < len(text) <= 18)
    else:
        assert str(number) == text.lstrip("0") or (number == 0 and set(text) == {"0"})


def test_digits_int_refuses_are_no_number() -> None:
    assert "\u00b2".isdigit() and wire.key_number("\u00b2") is None
    assert wire.key_number("\u0663") is None  # an Arabic-Indic three: int() reads it, we don't
    assert wire.key_number("000007") == 7
    assert wire.key_number("") is None and wire.key_number("1" * 19) is None
