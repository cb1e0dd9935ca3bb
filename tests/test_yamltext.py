"""The YAML emitter: what it writes reads back (PyYAML, YAML 1.1 like Go's readers) as exactly the data given."""

from __future__ import annotations

import yaml
from hypothesis import given, settings, strategies as st

from kimi_deploy.yamltext import FileMode, dump, dump_all, scalar

# Every character class a manifest may carry: printable ASCII, Unicode letters, newlines and spaces.
TEXT = st.text(st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="\ufeff") | st.sampled_from("\n "),
               max_size=40)
KEYS = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=20)
SCALARS = st.none() | st.booleans() | st.integers(-2**62, 2**62) | TEXT
DATA = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4),
                    max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(KEYS, DATA, max_size=5))
def test_any_document_reads_back_as_itself(document):
    if document:
        assert yaml.safe_load(dump(document)) == document


@given(TEXT)
def test_any_string_stays_a_string(text):
    assert yaml.safe_load(f"k: {scalar(text)}\n") == {"k": text}


def test_words_and_numbers_that_yaml_would_retype_are_quoted():
    for word in ("yes", "No", "on", "OFF", "y", "true", "null", "~", "1.5", "0x1f", "1:30", "2026-12-01", "-1",
                 ".inf", "64Gi", "0.0.0.0", "*", "&a", "!tag", "@x", "`x", "%x", "a: b", "a #b", ""):
        assert scalar(word).startswith('"'), word
        assert yaml.safe_load(f"k: {scalar(word)}") == {"k": word}
    for word in ("--model-path", "-m", "/models/x", "kimi_k2", "nvidia.com/gpu", "sglang.launch_server"):
        assert scalar(word) == word


def test_comments_and_several_documents():
    text = dump_all([({"a": 1}, ["first", "second line"]), ({"b": [1, {"c": "multi\nline\n"}]}, [])])
    assert text.startswith("# first\n# second line\na: 1\n---\n")
    assert list(yaml.safe_load_all(text)) == [{"a": 1}, {"b": [1, {"c": "multi\nline\n"}]}]


def test_a_file_mode_is_decimal_with_its_octal_in_a_comment():
    """New-operator trial (#30 item 6): the Secret's `defaultMode: 288` is right but opaque. It reads back as the
    number Kubernetes takes (decimal: YAML 1.1 and 1.2 disagree on a leading 0), the octal follows as a comment."""

    text = dump({"secret": {"defaultMode": FileMode(0o440)}, "modes": [FileMode(0o600)]})
    assert "defaultMode: 288  # 0440\n" in text and "- 384  # 0600\n" in text
    assert yaml.safe_load(text) == {"secret": {"defaultMode": 288}, "modes": [384]}
