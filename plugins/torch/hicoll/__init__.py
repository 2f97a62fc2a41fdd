"""hicoll: hierarchical AllGather / ReduceScatter.

``import hicoll.torch`` registers the torch.distributed backends ``"hicoll"`` and ``"smddp"``.
"""

__version__ = "0.1.0"
