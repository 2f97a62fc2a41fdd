"""Registers the torch.distributed backends "hicoll" and its alias "smddp".

    import hicoll.torch
    dist.init_process_group(backend="hicoll")          # or "smddp", "cpu:hicoll,cuda:nccl", ...

The creator is called once per process group (the world, new_group, DeviceMesh dimensions) with
that group's store; each group gets its own hicoll communicator. CUDA tensors run on hicoll,
stream-ordered on the caller's current stream, when the extension was built with CUDA
(cuda_build()). Calls hicoll does not run go to a gloo (CPU) or NCCL (CUDA) backend made lazily
on the same store under another prefix; they are counted (fallback_counts) and announced at
HICOLL_DEBUG=INFO.
"""

from __future__ import annotations

import atexit
import datetime
import logging

import torch
import torch.distributed as dist
from torch.distributed import PrefixStore

from hicoll import _C

__all__ = [
    "BACKEND_NAMES",
    "Options",
    "ProcessGroupHicoll",
    "backend_of",
    "cuda_build",
    "fallback_counts",
    "fallback_reasons",
    "hicoll_counts",
    "config",
    "stats",
]

logger = logging.getLogger("hicoll.torch")
ProcessGroupHicoll = _C.ProcessGroupHicoll
BACKEND_NAMES = ("hicoll", "smddp")


def _timeout_seconds(timeout) -> float:
    if timeout is None:
        return 1800.0
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    return float(timeout)


def _make_fallback_factory(timeout_s: float, group_name: str, global_ranks: list[int]):
    """Returns f(store, rank, size, device) -> gloo / NCCL backend on a prefixed store."""

    def make(store, rank: int, size: int, device: str):
        fb_store = PrefixStore(f"hicoll_fallback/{device}/", store)
        timeout = datetime.timedelta(seconds=timeout_s)
        if device == "cpu":
            if not dist.is_gloo_available():
                raise RuntimeError("hicoll: CPU fallback needs gloo, which this torch lacks")
            backend = dist.ProcessGroupGloo(fb_store, rank, size, timeout)
        elif device == "cuda":
            if not (dist.is_nccl_available() and torch.cuda.is_available()):
                raise RuntimeError("hicoll: CUDA fallback needs NCCL and a GPU")
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout
            opts.global_ranks_in_group = list(global_ranks)
            opts.group_name = f"{group_name}:hicoll_fallback"
            backend = dist.ProcessGroupNCCL(fb_store, rank, size, opts)
        else:
            raise RuntimeError(f"hicoll: no fallback backend for device {device!r}")
        logger.info("hicoll: made the %s fallback for group %r (rank %d of %d)",
                    backend.name(), group_name, rank, size)
        return backend

    return make


class Options:
    """Per-group configuration of the hicoll communicator (its hcConfig_t), as
    ProcessGroupNCCL.Options is NCCL's: ``init_process_group("hicoll", pg_options=Options(...))``
    or ``new_group(..., pg_options=Options(...))``. Each field left None takes its environment
    variable (env.md); a field set overrides it for this group only, checked like the variable.
    """

    FIELDS = ("algo", "force_fallback", "debug", "name", "topo_node", "timeout_ms", "chunk_size",
              "net_chunk_size", "net_window", "device_chunk_size", "allreduce_small_bytes",
              "scratch_bytes", "sort_bytes", "quant_min_nodes")

    def __init__(self, *, algo=None, force_fallback=None, debug=None, name=None, topo_node=None,
                 timeout_ms=None, chunk_size=None, net_chunk_size=None, net_window=None,
                 device_chunk_size=None, allreduce_small_bytes=None, scratch_bytes=None,
                 sort_bytes=None, quant_min_nodes=None):
        args = dict(locals())
        for f in self.FIELDS:
            setattr(self, f, args[f])

    def as_dict(self) -> dict:
        out = {}
        for f in self.FIELDS:
            v = getattr(self, f)
            if v is None:
                continue
            out[f] = v if isinstance(v, str) else int(v)
        return out

    def __repr__(self) -> str:
        return f"hicoll.torch.Options({', '.join(f'{k}={v!r}' for k, v in self.as_dict().items())})"


def _create_backend(dist_opts, backend_options=None):
    """Creator for Backend.register_backend(..., extended_api=True)."""
    if backend_options is not None and not isinstance(backend_options, Options):
        raise TypeError(f"hicoll: pg_options must be hicoll.torch.Options, not {type(backend_options).__name__}")
    timeout_s = _timeout_seconds(dist_opts.timeout)
    group_name = str(dist_opts.group_id or "")
    global_ranks = [int(r) for r in (dist_opts.global_ranks_in_group or [])]
    return ProcessGroupHicoll(
        dist_opts.store,
        dist_opts.group_rank,
        dist_opts.group_size,
        timeout_s,
        group_name,
        global_ranks,
        _make_fallback_factory(timeout_s, group_name, global_ranks),
        backend_options.as_dict() if backend_options is not None else {},
    )


def _register() -> None:
    """Registers "hicoll" and "smddp" (idempotent). Also the registrar of the
    torch.distributed.backends entry points: torch >= 2.14 calls it on
    init_process_group("hicoll") without any import of hicoll."""
    for name in BACKEND_NAMES:
        if name.upper() in dist.Backend._plugins:
            continue
        dist.Backend.register_backend(
            name, _create_backend, extended_api=True, devices=["cpu", "cuda"]
        )


def cuda_build() -> bool:
    """Whether this extension runs CUDA tensors on hicoll (else they go to NCCL)."""
    return bool(_C.cuda_build)


def _backend_or_none(group, device: str):
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    try:
        backend = pg._get_backend(torch.device(device))
    except RuntimeError:  # no backend for that device type
        return pg, None
    return pg, backend if isinstance(backend, ProcessGroupHicoll) else None


def backend_of(group=None, device: str = "cpu") -> ProcessGroupHicoll:
    """The hicoll backend of a process group (default: the world) for a device type."""
    pg, backend = _backend_or_none(group, device)
    if backend is None:
        raise ValueError(f"group {pg.group_name!r} has no hicoll backend for {device} "
                         f"(its backend is {dist.get_backend(pg)!r})")
    return backend


def fallback_counts(group=None, device: str = "cpu") -> dict[str, int]:
    """Calls of this group forwarded to gloo/NCCL, by c10d op name ({} for a group without a
    hicoll backend: nothing of it goes through hicoll's fallback)."""
    _, backend = _backend_or_none(group, device)
    return dict(backend.fallback_counts()) if backend is not None else {}


def fallback_reasons(group=None, device: str = "cpu") -> dict[str, str]:
    """The last reason each op fell back, by c10d op name ({} without a hicoll backend)."""
    _, backend = _backend_or_none(group, device)
    return dict(backend.fallback_reasons()) if backend is not None else {}


def hicoll_counts(group=None, device: str = "cpu") -> dict[str, int]:
    """Calls of this group run by hicoll, by c10d op name ({} without a hicoll backend)."""
    _, backend = _backend_or_none(group, device)
    return dict(backend.hicoll_counts()) if backend is not None else {}


def config(group=None, device: str = "cpu") -> dict:
    """hcCommGetConfig of the group's communicator: what it runs with."""
    return backend_of(group, device).config()


def stats(group=None, device: str = "cpu") -> dict:
    """hcCommGetStats of the group's communicator (paths taken, bytes intra/inter node)."""
    return backend_of(group, device).stats()


# FSDP2's int8 collectives live in hicoll.fsdp2: their base classes import FSDP (and sympy
# with it), ~45 MB and a second per rank that a job not using them should not pay when
# init_process_group loads this module.
_FSDP2_NAMES = ("QuantizedAllGather", "QuantizedReduceScatter")


def __getattr__(name: str):
    if name in _FSDP2_NAMES:
        from hicoll import fsdp2

        return getattr(fsdp2, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_register()
# Before the interpreter finalizes: finish and join every group's worker, so none of them
# runs (or drops a Python-owned tensor) after Python stopped accepting threads.
atexit.register(_C._shutdown_all)
