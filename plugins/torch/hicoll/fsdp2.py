"""FSDP2's custom collectives on hicoll: int8 all-gather and reduce-scatter for
fully_shard's set_custom_all_gather / set_custom_reduce_scatter. Also reachable as
hicoll.torch.QuantizedAllGather / QuantizedReduceScatter (imported on first use: FSDP's
modules cost every process that loads them)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from hicoll.torch import _backend_or_none, backend_of, logger

__all__ = ["QuantizedAllGather", "QuantizedReduceScatter"]

try:  # the FSDP2 custom-collective interface (torch >= 2.8)
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather as _FsdpAllGather
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter as _FsdpReduceScatter
except ImportError:  # older torch: plain objects with the same two methods
    _FsdpAllGather = _FsdpReduceScatter = object


class _QuantizedComm:
    """What the quantized FSDP2 collectives share: the block, the counts, the warn-once log."""

    def __init__(self, block: int = 256):
        if block < 1:
            raise ValueError(f"{type(self).__name__}: block must be positive, not {block}")
        self.block = int(block)
        self.quantized_calls = 0
        self.exact_calls = 0
        self._logged = set()

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    # Devices whose hicoll backend quantizes this collective.
    _devices = ("cpu", "cuda")
    _coll = ""

    def _why_exact(self, output, input, group):
        if input.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            return f"dtype {input.dtype} cannot be quantized"
        device = input.device.type
        if device not in self._devices:
            return f"{device} tensors have no quantized {self._coll} yet"
        if _backend_or_none(group, device)[1] is None:
            return f"the group has no hicoll {device.upper()} backend"
        return None

    def _exact(self, why: str) -> None:
        if why not in self._logged:
            self._logged.add(why)
            logger.warning("%s: exact collective: %s", type(self).__name__, why)
        self.exact_calls += 1

    @staticmethod
    def _finish(work, async_op: bool):
        if async_op:
            return work
        work.wait()
        return None


class QuantizedAllGather(_QuantizedComm, _FsdpAllGather):
    """An all-gather that moves each rank's shard as int8 with one fp32 scale per `block`
    elements (hcAllGatherQuantized: ZeRO++'s qwZ), for FSDP2::

        model.set_custom_all_gather(hicoll.torch.QuantizedAllGather())

    Every rank receives the same dequantized values (its own shard too), off by at most
    absmax(block) / 254 per element; the sharded parameters stay exact. CPU and CUDA tensors
    (CUDA: on the caller's stream, through hicoll's device path). Inputs it cannot quantize
    (not float32/bfloat16/float16, e.g. FSDP2's uint8 buffers of mixed dtypes, or a group
    without a hicoll backend for their device) take the exact all-gather, logged once per reason.
    Also callable directly: qag(output, input, group)."""

    _coll = "all-gather"

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group=None,
                 async_op: bool = False):
        why = self._why_exact(output_tensor, input_tensor, group)
        if why is None:
            self.quantized_calls += 1
            backend = backend_of(group, input_tensor.device.type)
            work = backend.allgather_quantized(output_tensor, input_tensor, self.block)
        else:
            self._exact(why)
            work = dist.all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=True)
        return self._finish(work, async_op)


class QuantizedReduceScatter(_QuantizedComm, _FsdpReduceScatter):
    """A reduce-scatter whose partial sums cross nodes as int8 with one fp32 scale per `block`
    elements (hcReduceScatterQuantized), for FSDP2's gradients::

        model.set_custom_reduce_scatter(hicoll.torch.QuantizedReduceScatter())

    Within a node the sums stay exact; each node's partial is quantized once and summed in fp32
    at its owner. CPU and CUDA tensors (CUDA: hicoll's device path). On one node (or with
    HICOLL_QUANT_MIN_NODES above the group's nodes) it is exact. Inputs it cannot quantize
    (dtype, device, an op other than sum or avg, no hicoll backend for their device) take the
    exact reduce-scatter, with one warning per reason."""

    _coll = "reduce-scatter"

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group=None, op=None,
                 async_op: bool = False):
        op = dist.ReduceOp.SUM if op is None else op
        why = self._why_exact(output_tensor, input_tensor, group)
        if why is None and op != dist.ReduceOp.SUM and op != dist.ReduceOp.AVG:
            why = f"op {op} is quantized only as a sum or an average"
        if why is None:
            self.quantized_calls += 1
            backend = backend_of(group, input_tensor.device.type)
            work = backend.reducescatter_quantized(output_tensor, input_tensor, op, self.block)
        else:
            self._exact(why)
            work = dist.reduce_scatter_tensor(output_tensor, input_tensor, op=op, group=group, async_op=True)
        return self._finish(work, async_op)
