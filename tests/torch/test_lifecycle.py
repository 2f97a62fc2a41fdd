"""Process-group lifecycle with backend="hicoll": exit without destroy_process_group never
aborts; destroy + init again on the same store always works."""
from harness import launch


def test_exit_without_destroy():
    # Before the fix: rank 0 aborted ("terminate called without an active exception") when its
    # worker dropped the last reference to the in-flight call's tensor during finalization.
    for r in launch("lifecycle:exit_without_destroy", 2, timeout=60):
        assert r["exit"] == "without destroy_process_group"


def test_reinit_20_times_on_one_store():
    # Before the fix: the second init read the first communicator's keys (shm_open ... No
    # such file, or a hang until the bootstrap timeout).
    res = launch("lifecycle:reinit", 2, nodes=1, timeout=240,
                 env={"HICOLL_TIMEOUT_MS": "10000"})
    assert res[0]["incarnations"] == list(range(20))


def test_reinit_two_nodes():
    res = launch("lifecycle:reinit", 4, nodes=2, timeout=240, times=5,
                 env={"HICOLL_TIMEOUT_MS": "10000"})
    assert res[0]["incarnations"] == list(range(5))
