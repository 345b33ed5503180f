import pytest

from kvfence.keys.apikey import KEY_LEN, is_digest, is_well_formed, key_digest, mint_key


def test_minted_keys_are_well_formed_and_distinct() -> None:
    keys = {mint_key() for _ in range(50)}
    assert len(keys) == 50
    assert all(k.startswith("kvf_") and len(k) == KEY_LEN and is_well_formed(k) for k in keys)


def test_one_mistyped_character_fails_the_checksum() -> None:
    key = mint_key()
    for i in range(4, len(key)):
        swapped = "a" if key[i] != "a" else "b"
        assert not is_well_formed(key[:i] + swapped + key[i + 1 :])


@pytest.mark.parametrize("bad", ["", "kvf_", "sk-abc", "kvf_" + "A" * (KEY_LEN - 4)])
def test_malformed_keys(bad: str) -> None:
    assert not is_well_formed(bad)


def test_digest_is_keyed_by_the_pepper() -> None:
    key = mint_key()
    d1 = key_digest(b"p" * 16, key)
    assert is_digest(d1) and d1 == key_digest(b"p" * 16, key)
    assert d1 != key_digest(b"q" * 16, key)
    assert key not in d1
    with pytest.raises(ValueError, match="pepper"):
        key_digest(b"short", key)


def test_a_key_minted_by_an_earlier_release_stays_well_formed() -> None:
    # Keys already handed to tenants must keep passing the checksum whatever its code becomes.
    known = "kvf_kbthpx573biki3mb2xg3bdarsq3aws2dgbq4pkhv22ul2vqntweaewtdco"
    assert is_well_formed(known)
    flipped = known[:-1] + ("a" if known[-1] != "a" else "b")
    assert not is_well_formed(flipped)
