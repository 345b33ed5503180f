"""Pooled request ids and nonces: never repeated within a process, and a forked worker draws its
own pool rather than its parent's next bytes."""

from __future__ import annotations

import os

from gateway import entropy


def test_ids_do_not_repeat_across_pool_refills() -> None:
    ids = [entropy.token_hex(16) for _ in range(2000)]  # several pools of 4 KiB
    assert len(set(ids)) == len(ids)
    assert all(len(i) == 32 for i in ids)
    nonces = [entropy.nonce32() for _ in range(1000)]
    assert all(0 < n < 2**32 for n in nonces)


def test_a_forked_child_does_not_hand_out_its_parents_next_ids() -> None:
    entropy.token_hex(16)  # the parent holds a pool with bytes left
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id, then out without running the parent's cleanup
        os.close(read)
        os.write(write, entropy.token_hex(16).encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 64).decode()
    os.close(read)
    os.waitpid(pid, 0)
    assert child != entropy.token_hex(16)
