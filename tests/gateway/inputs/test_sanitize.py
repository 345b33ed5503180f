"""Client-supplied cache-scoping inputs are found and removed in every spelling (any case, `_` or
`-`), at the top level and inside `nvext`, and nothing else in a request is touched."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.inputs.scoping import is_scoping_header, scoping_headers, strip_body

HEADERS = ["x-tenant-id", "x-cache-salt", "cache-salt", "x-kvfence-handle", "x-kvfence-namespace"]
FIELDS = ["cache_salt", "extra_key", "prompt_cache_key"]


def spellings(canonical: str) -> st.SearchStrategy[str]:
    """Any spelling of `canonical`: each letter in either case, each separator `_` or `-`."""
    chars = [
        st.sampled_from(["_", "-"]) if c in "_-" else st.sampled_from([c.lower(), c.upper()])
        for c in canonical
    ]
    return st.tuples(*chars).map("".join)


# headers


@pytest.mark.parametrize(
    ("name", "canonical"),
    [
        ("x-tenant-id", "x-tenant-id"),
        ("X-Tenant-Id", "x-tenant-id"),
        ("X_TENANT_ID", "x-tenant-id"),
        ("x_tenant-id", "x-tenant-id"),
        ("X-Cache-Salt", "x-cache-salt"),
        ("x_cache_salt", "x-cache-salt"),
        ("Cache-Salt", "cache-salt"),
        ("CACHE_SALT", "cache-salt"),
        ("X-KVFence-Handle", "x-kvfence-handle"),
        ("x_kvfence_handle", "x-kvfence-handle"),
        ("X-KVFENCE-NAMESPACE", "x-kvfence-namespace"),
        ("x_Kvfence-namespace", "x-kvfence-namespace"),
    ],
)
def test_scoping_headers_are_found_in_any_spelling(name: str, canonical: str) -> None:
    assert is_scoping_header(name)
    assert scoping_headers([name]) == [canonical]


@given(st.sampled_from(HEADERS).flatmap(lambda h: st.tuples(st.just(h), spellings(h))))
def test_every_spelling_of_every_scoping_header_is_found(pair: tuple[str, str]) -> None:
    canonical, name = pair
    assert is_scoping_header(name)
    assert scoping_headers(["Authorization", name, "Content-Type"]) == [canonical]


@pytest.mark.parametrize(
    "name",
    [
        "Authorization",
        "Content-Type",
        "X-Request-Id",
        "x-tenant",
        "tenant-id",
        "x-tenant-ids",
        "x-cache-salty",
        "salt",
        "x-kvfence",
        "x-kvfence-handles",
        "x tenant id",
        "",
    ],
)
def test_other_headers_are_not_scoping(name: str) -> None:
    assert not is_scoping_header(name)
    assert scoping_headers([name]) == []


def test_each_copy_of_a_scoping_header_is_reported() -> None:
    names = ["X-Tenant-Id", "Accept", "x_tenant_id", "Cache-Salt", "X-Kvfence-Handle"]
    assert scoping_headers(names) == [
        "x-tenant-id",
        "x-tenant-id",
        "cache-salt",
        "x-kvfence-handle",
    ]


def test_no_headers_no_scoping_headers() -> None:
    assert scoping_headers([]) == []


# bodies


@pytest.mark.parametrize(
    ("field", "canonical"),
    [
        ("cache_salt", "cache_salt"),
        ("CACHE_SALT", "cache_salt"),
        ("Cache-Salt", "cache_salt"),
        ("cache-salt", "cache_salt"),
        ("extra_key", "extra_key"),
        ("Extra-Key", "extra_key"),
        ("EXTRA-KEY", "extra_key"),
        ("prompt_cache_key", "prompt_cache_key"),
        ("Prompt-Cache-Key", "prompt_cache_key"),
        ("PROMPT_cache-KEY", "prompt_cache_key"),
    ],
)
def test_top_level_scoping_fields_are_removed_in_any_spelling(field: str, canonical: str) -> None:
    body: dict[str, Any] = {"model": "m", field: "evil", "messages": [{"role": "user"}]}
    assert strip_body(body) == [canonical]
    assert body == {"model": "m", "messages": [{"role": "user"}]}


def test_every_copy_is_removed_and_reported() -> None:
    body: dict[str, Any] = {
        "cache_salt": "a",
        "Cache-Salt": "b",
        "CACHE_SALT": "c",
        "extra_key": "d",
        "prompt_cache_key": "e",
        "model": "m",
    }
    removed = strip_body(body)
    assert sorted(removed) == sorted(
        ["cache_salt", "cache_salt", "cache_salt", "extra_key", "prompt_cache_key"]
    )
    assert body == {"model": "m"}


@pytest.mark.parametrize("nvext", ["nvext", "NVEXT", "NvExt"])
@pytest.mark.parametrize("field", ["cache_salt", "Cache-Salt", "EXTRA_KEY", "prompt-cache-key"])
def test_scoping_fields_inside_nvext_are_removed(nvext: str, field: str) -> None:
    body: dict[str, Any] = {"model": "m", nvext: {field: "evil", "greed_sampling": True}}
    removed = strip_body(body)
    assert removed == [f"nvext.{field.lower().replace('-', '_')}"]
    assert body == {"model": "m", nvext: {"greed_sampling": True}}


def test_top_level_and_nested_fields_are_all_reported() -> None:
    body: dict[str, Any] = {
        "model": "m",
        "cache_salt": "top",
        "nvext": {"extra_key": "inner", "cache-salt": "inner2", "ignore_eos": True},
    }
    removed = strip_body(body)
    assert sorted(removed) == ["cache_salt", "nvext.cache_salt", "nvext.extra_key"]
    assert body == {"model": "m", "nvext": {"ignore_eos": True}}


def test_an_emptied_nvext_stays_as_an_empty_object() -> None:
    body: dict[str, Any] = {"nvext": {"cache_salt": "x"}}
    assert strip_body(body) == ["nvext.cache_salt"]
    assert body == {"nvext": {}}


@pytest.mark.parametrize("nvext", [None, "cache_salt", ["cache_salt"], 3, True, [{"a": 1}]])
def test_a_non_object_nvext_is_left_alone(nvext: Any) -> None:
    body: dict[str, Any] = {"model": "m", "nvext": nvext, "extra_key": "x"}
    assert strip_body(body) == ["extra_key"]
    assert body == {"model": "m", "nvext": nvext}


def test_scoping_names_nested_elsewhere_are_not_touched() -> None:
    body: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "user", "content": "cache_salt", "cache_salt": "in a message"}],
        "metadata": {"cache_salt": "not ours to judge"},
        "nvext": {"nested": {"cache_salt": "deeper"}},
    }
    before = copy.deepcopy(body)
    assert strip_body(body) == []
    assert body == before


def test_a_body_without_scoping_fields_is_unchanged() -> None:
    body: dict[str, Any] = {
        "model": "m",
        "cache": True,
        "salt": "s",
        "cache_salts": 1,
        "x_cache_salt": 2,
        "extra": {"key": 1},
        "nvext": {"top_k": 5},
    }
    before = copy.deepcopy(body)
    assert strip_body(body) == []
    assert body == before


def test_an_empty_body_is_fine() -> None:
    body: dict[str, Any] = {}
    assert strip_body(body) == []
    assert body == {}


# property: whatever else a body holds, only the scoping keys go

KEY_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-"


def _canonical(key: str) -> str:
    return key.lower().replace("-", "_")


plain_keys = st.text(KEY_ALPHABET, max_size=20).filter(
    lambda k: _canonical(k) not in {*FIELDS, "nvext"}
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)
scoping_keys = st.sampled_from(FIELDS).flatmap(spellings)


@given(
    st.dictionaries(plain_keys, json_values, max_size=8),
    st.dictionaries(scoping_keys, json_values, max_size=6),
    st.data(),
)
def test_only_the_scoping_keys_are_removed(
    plain: dict[str, Any], scoping: dict[str, Any], data: st.DataObject
) -> None:
    # Interleave the scoping keys among the others, at random places.
    items = list(plain.items())
    for item in scoping.items():
        items.insert(data.draw(st.integers(0, len(items))), item)
    body = dict(items)
    removed = strip_body(body)
    assert body == plain
    assert list(body) == list(plain)  # the order of what stays is kept too
    assert sorted(removed) == sorted(_canonical(k) for k in scoping)


@given(
    st.dictionaries(plain_keys, json_values, max_size=6),
    st.dictionaries(scoping_keys, json_values, max_size=4),
    st.sampled_from(["nvext"]).flatmap(spellings),
)
def test_only_the_scoping_keys_inside_nvext_are_removed(
    plain: dict[str, Any], scoping: dict[str, Any], nvext: str
) -> None:
    body: dict[str, Any] = {"model": "m", nvext: {**scoping, **plain}}
    removed = strip_body(body)
    assert body == {"model": "m", nvext: plain}
    assert sorted(removed) == sorted(f"nvext.{_canonical(k)}" for k in scoping)
