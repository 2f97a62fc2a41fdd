import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def pytest_collection_modifyitems(config, items):
    """Keep only the selected tests of torch's own suite (test_peer.SELECTED), unless
    HICOLL_PEER_ALL=1 (perf/torch/peer_compare.py runs the whole class)."""
    if os.environ.get("HICOLL_PEER_ALL") == "1":
        return
    keep, drop = [], []
    for item in items:
        cls = getattr(item, "cls", None)
        if cls is not None and cls.__name__ == "TestHicollPeer":
            from test_peer import SELECTED
            (keep if item.name in SELECTED else drop).append(item)
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
