"""A small character-level transformer LM trained with FSDP2 (fully_shard) on CPU over hicoll.

    torchrun --nproc-per-node 4 examples/fsdp2_train.py                # FSDP over 4 ranks
    torchrun --nproc-per-node 4 examples/fsdp2_train.py --hsdp         # HSDP, 2x2 DeviceMesh
    torchrun --nproc-per-node 4 examples/fsdp2_train.py --bf16 --text my.txt

The text is the fortunes of the Debian package fortunes-min (/usr/share/games/fortunes) unless
--text names a file. Every rank trains on its slice of the same global batch; rank 0 prints the
loss, which falls. tests/torch and perf/torch import TinyLM, load_text, Batches and train_step.
"""
from __future__ import annotations

import argparse
import glob
import math
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

FORTUNES = "/usr/share/games/fortunes"


def load_text(path: str | None = None) -> str:
    if path:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    files = sorted(f for f in glob.glob(os.path.join(FORTUNES, "*"))
                   if os.path.isfile(f) and not f.endswith((".dat", ".u8")))
    if not files:
        raise SystemExit(f"no text: install fortunes-min ({FORTUNES}) or pass --text FILE")
    text = []
    for f in files:
        with open(f, encoding="utf-8", errors="replace") as fh:
            text.append(fh.read().replace("\n%\n", "\n\n"))
    return "\n".join(text)


class Batches:
    """Deterministic random windows of the text: the global batch of step s is the same for
    every world size; rank r takes rows [r*B/W, (r+1)*B/W)."""

    def __init__(self, text: str, seq_len: int, global_batch: int, seed: int = 0):
        chars = sorted(set(text))
        self.vocab = len(chars)
        index = {c: i for i, c in enumerate(chars)}
        self.data = torch.tensor([index[c] for c in text], dtype=torch.long)
        self.seq_len, self.global_batch, self.seed = seq_len, global_batch, seed

    def global_step(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 100003 + step)
        starts = torch.randint(0, len(self.data) - self.seq_len - 1, (self.global_batch,), generator=g)
        idx = starts[:, None] + torch.arange(self.seq_len + 1)
        win = self.data[idx]
        return win[:, :-1], win[:, 1:]

    def local_step(self, step: int, rank: int, world: int):
        x, y = self.global_step(step)
        per = self.global_batch // world
        return x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]


class Block(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyLM(nn.Module):
    def __init__(self, vocab: int, dim: int = 128, layers: int = 4, heads: int = 4,
                 seq_len: int = 64):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(seq_len, dim) * 0.02)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def build_model(vocab: int, seed: int = 0, **kw) -> TinyLM:
    torch.manual_seed(seed)  # same initial weights on every rank and in the reference
    return TinyLM(vocab, **kw)


def shard(model: TinyLM, mesh=None, bf16: bool = False) -> TinyLM:
    """fully_shard each block, then the root (FSDP with a 1-D mesh, HSDP with a 2-D one)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    kw = {"mesh": mesh} if mesh is not None else {}
    if bf16:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                               reduce_dtype=torch.float32)
    for blk in model.blocks:
        fully_shard(blk, **kw)
    fully_shard(model, **kw)
    return model


def train_step(model, opt, x, y) -> torch.Tensor:
    logits = model(x)
    loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.detach()


def make_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)


def use_pg_alloc(model, on: bool = True) -> None:
    """FSDP2's communication buffers from the process group (hicoll: node memory)."""
    for m in model.modules():
        if hasattr(m, "set_allocate_memory_from_process_group_for_comm"):
            m.set_allocate_memory_from_process_group_for_comm(on)


def use_custom_all_gather(model, comm) -> None:
    """Every FSDP2 module's parameter all-gather through comm (e.g. hicoll's quantized one)."""
    for m in model.modules():
        if hasattr(m, "set_custom_all_gather"):
            m.set_custom_all_gather(comm)


def train_losses(model, opt, data, steps: int, rank: int, world: int, times=None) -> list[float]:
    """steps of training on this rank's slice of each global batch; the global-batch losses."""
    out = []
    for step in range(steps):
        t0 = time.perf_counter()
        x, y = data.local_step(step, rank, world)
        loss = train_step(model, opt, x, y)
        dist.all_reduce(loss, op=dist.ReduceOp.AVG)  # the global-batch loss
        out.append(loss.item())
        if times is not None:
            times.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--text", help="training text (default: the fortunes of fortunes-min)")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--global-batch", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--backend", default="hicoll")
    ap.add_argument("--hsdp", action="store_true", help="2-D mesh: replicate x shard")
    ap.add_argument("--bf16", action="store_true", help="bf16 params, fp32 gradient reduction")
    ap.add_argument("--pg-alloc", action="store_true",
                    help="communication buffers from the process group (FSDP2's "
                         "set_allocate_memory_from_process_group_for_comm; hicoll: node memory)")
    ap.add_argument("--quantized-allgather", action="store_true",
                    help="parameter all-gathers as int8 + one scale per 256 elements "
                         "(hicoll.torch.QuantizedAllGather through set_custom_all_gather)")
    args = ap.parse_args()

    if args.backend in ("hicoll", "smddp") or "hicoll" in args.backend:
        import hicoll.torch  # noqa: F401  registers the backend
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))

    from torch.distributed.device_mesh import init_device_mesh
    if args.hsdp:
        rep = 2 if world % 2 == 0 and world > 2 else 1
        mesh = init_device_mesh("cpu", (rep, world // rep), mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh("cpu", (world,))

    data = Batches(load_text(args.text), args.seq_len, args.global_batch)
    model = shard(build_model(data.vocab, seq_len=args.seq_len), mesh, args.bf16)
    if args.pg_alloc:
        use_pg_alloc(model)
    if args.quantized_allgather:
        import hicoll.torch as ht
        use_custom_all_gather(model, ht.QuantizedAllGather())
    opt = make_optimizer(model)
    times = []
    losses = train_losses(model, opt, data, args.steps, rank, world, times)
    first, last = losses[0], losses[-1]
    if rank == 0:
        for step in list(range(0, args.steps, 10)) + [args.steps - 1]:
            print(f"step {step:4d}  loss {losses[step]:.4f}  ({math.exp(losses[step]):.1f} ppl)", flush=True)
        # The first steps build communicators and FSDP's lazy state: the median of the rest.
        steady = sorted(times[2:] if len(times) > 4 else times)
        dt = steady[len(steady) // 2]
        if os.environ.get("FSDP_TRAIN_STEP_TIMES"):
            print("step ms: " + " ".join(f"{t * 1000:.1f}" for t in times), flush=True)
        print(f"backend={args.backend} world={world} {'HSDP' if args.hsdp else 'FSDP'}"
              f"{' bf16' if args.bf16 else ''}{' pg-alloc' if args.pg_alloc else ''}"
              f"{' int8-allgather' if args.quantized_allgather else ''}: loss {first:.4f} -> {last:.4f}, "
              f"{dt * 1000:.1f} ms/step (median)", flush=True)
    dist.destroy_process_group()
    if rank == 0 and not last < first:
        raise SystemExit("loss did not fall")


if __name__ == "__main__":
    main()
