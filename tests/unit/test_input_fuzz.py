"""Fuzzing the readers of input files: profiles, cluster definitions, vendor files.

Whatever a file holds, reading it either succeeds or raises InvalidInput whose every problem names
that file and a place in it; any other exception (a traceback for the user) fails the test. Three
kinds of documents: arbitrary text built from YAML's punctuation, the valid base documents of the
malformed-input corpus with one value replaced by an arbitrary one, and those documents with a
random slice of their text cut out or repeated. Example counts are modest and the runs derandomized,
so the file takes seconds and fails the same way every time.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fake_devices import profile
from fake_devices.errors import InvalidInput
from harness.config import cluster
from harness.vendor import file as vendor

DATA = Path(__file__).resolve().parent / "testdata" / "malformed"
BASES = {"profile": "base-profile.yaml", "cluster": "base-cluster.yaml", "vendor": "base-vendor.yaml"}
READERS = {"profile": profile.load, "cluster": cluster.load, "vendor": vendor.load}
FUZZ = settings(max_examples=80, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

YAML_ALPHABET = st.sampled_from(list("abcdefgiKMGTPe0123456789 \n\t-:,[]{}&*!|>'\"#%@`?.+_/=~\\") +
                                ["１", "é", "\u00a0", "\x00", "\x85", "\ufeff", "---", "...", "!!python/object", "<<",
                                 "&a", "*a", "2024-13-45", "9" * 50, "1e99999999", ".inf"])
yaml_text = st.lists(YAML_ALPHABET, max_size=120).map("".join)
scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10**40), max_value=10**40),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30),
                    st.sampled_from(["１Ti", "1e99999999", "8-3", "", "-", "0", "1Ki5", "Pi", "a" * 300]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                        st.dictionaries(st.text(max_size=12), inner, max_size=4)),
                      max_leaves=12)


def _paths(doc, prefix=()):
    """Every place in a document where a value could be replaced."""
    yield prefix
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            yield from _paths(value, (*prefix, index))


def _replaced(doc, path, value):
    if not path:
        return value
    target = doc
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return doc


def _read_checked(kind: str, path: Path) -> None:
    try:
        READERS[kind](str(path))
    except InvalidInput as err:
        assert err.problems, "InvalidInput without problems"
        for problem in err.problems:
            assert problem.field, problem
            # the file read, or (clusters) a profile file the definition names
            assert problem.source == str(path) or (kind == "cluster" and Path(problem.source).exists()), problem
    except RecursionError:  # pragma: no cover - named apart so a failure says what happened
        pytest.fail(f"RecursionError reading {path}")


@pytest.mark.parametrize("kind", sorted(READERS))
@FUZZ
@given(content=yaml_text)
def test_arbitrary_text_is_read_or_refused_with_located_problems(kind, content, tmp_path):
    path = tmp_path / "fuzz.yaml"
    path.write_text(content, encoding="utf-8", errors="surrogatepass")
    _read_checked(kind, path)


@pytest.mark.parametrize("kind", sorted(READERS))
@FUZZ
@given(data=st.data())
def test_base_documents_with_one_value_replaced_are_read_or_refused(kind, data, tmp_path):
    doc = yaml.safe_load((DATA / BASES[kind]).read_text())
    path_in_doc = data.draw(st.sampled_from(list(_paths(doc))))
    doc = _replaced(doc, path_in_doc, data.draw(values))
    path = tmp_path / "fuzz.yaml"
    try:
        text = yaml.safe_dump(doc, allow_unicode=True)
    except yaml.YAMLError:
        return  # PyYAML cannot write every Python value; nothing to read then
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    _read_checked(kind, path)


@pytest.mark.parametrize("kind", sorted(READERS))
@FUZZ
@given(data=st.data())
def test_base_documents_cut_or_repeated_are_read_or_refused(kind, data, tmp_path):
    text = (DATA / BASES[kind]).read_text()
    start = data.draw(st.integers(0, len(text)))
    end = data.draw(st.integers(start, len(text)))
    repeat = data.draw(st.integers(0, 3))
    path = tmp_path / "fuzz.yaml"
    path.write_text(text[:start] + text[start:end] * repeat + text[end:])
    _read_checked(kind, path)
