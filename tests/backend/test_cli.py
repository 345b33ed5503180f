"""`kvfence backend`'s command line: nothing on it can switch off the isolation boundary."""

from __future__ import annotations

import pytest

from kvfence.cli import main as kvfence_main


@pytest.mark.parametrize("flag", ["--fault-foreign-block", "--no-zero-on-reuse"])
def test_no_flag_turns_isolation_off(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        kvfence_main(["backend", "--trust", "t.json", "--signing-key", "k.pem", flag])
    assert info.value.code == 2
    assert "unrecognized arguments" in capsys.readouterr().err
