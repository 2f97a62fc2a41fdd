"""smdistributed.dataparallel.torch on hicoll: torch_smddp (v2 scripts), distributed and
parallel.distributed (v1 scripts)."""
