"""hicoll's stand-in for SageMaker's smdistributed (only dataparallel.torch; see
hicoll-smddp in hicoll's plugins/torch/smddp)."""
HICOLL_SHIM = True
