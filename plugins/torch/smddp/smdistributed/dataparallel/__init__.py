"""SMDDP data parallelism on hicoll."""
