"""The view's HTML builder escapes every value that is not already markup."""

from __future__ import annotations

import pytest

from hamid.scheduler.ui.markup import Safe, el, esc, join, path_part


def test_text_and_attributes_are_escaped() -> None:
    hostile = '<script>alert("x")</script>&\''
    out = el("td", hostile, title=hostile)
    assert out == (
        '<td title="&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;&#x27;">'
        "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;&#x27;</td>"
    )


def test_safe_markup_nests_and_none_false_are_dropped() -> None:
    inner = el("b", "x")
    assert el("p", inner, None, False, [1, [2.5, "<"]]) == "<p><b>x</b>12.5&lt;</p>"
    assert join("a", inner) == "a<b>x</b>"
    assert isinstance(join(), Safe)


def test_attribute_spelling_void_elements_and_booleans() -> None:
    assert el("rect", class_="cpu", data_pod="ns/p", viewBox="0 0 1 1") == (
        '<rect class="cpu" data-pod="ns/p" viewBox="0 0 1 1"></rect>'
    )
    assert (
        el("script", src="a.js", defer=True, hidden=False, title=None) == '<script src="a.js" defer></script>'
    )
    assert el("meta", charset="utf-8") == '<meta charset="utf-8">'


@pytest.mark.parametrize("tag", ["", "a b", "x>", "1a"])
def test_only_element_names_are_tags(tag: str) -> None:
    with pytest.raises(ValueError, match="element name"):
        el(tag)


def test_only_attribute_names_are_attributes() -> None:
    with pytest.raises(ValueError, match="attribute name"):
        el("p", **{"on click": "x"})


def test_numbers_and_safe_pass_through_esc() -> None:
    assert esc(5) == "5" and esc(True) == "True" and esc(Safe("<b>")) == "<b>"


def test_path_parts_quote_every_reserved_character() -> None:
    assert path_part("a/b?c#d <e>") == "a%2Fb%3Fc%23d%20%3Ce%3E"
