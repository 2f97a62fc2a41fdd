"""The clients users train with, each run twice in the same rank process -- on gloo, then on
hicoll -- with the same tiny model (built from a config), synthetic data and seeds; started by
test_clients.py as ranks.py "clients:run". Each run returns its per-step losses and the calls
that went to hicoll's gloo fallback (hicoll.torch.fallback_counts, over every group)."""
from __future__ import annotations

import os
import tempfile
import traceback

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # DeepSpeed's CPU accelerator, before its import
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from ranks import RANK, TIMEOUT, WORLD  # noqa: E402

import hicoll.torch as ht  # noqa: E402

STEPS = 5
BASE_PORT = int(os.environ["MASTER_PORT"])
_base_store = None
_run = 0


def _next_run() -> int:
    global _run
    _run += 1
    return _run


def init(backend: str) -> None:
    """A process group on a fresh prefix of one store (gloo, like hicoll before its fix,
    reads stale keys when a group is made again on the same keys)."""
    global _base_store
    if _base_store is None:
        _base_store = dist.TCPStore("127.0.0.1", BASE_PORT, WORLD, is_master=RANK == 0,
                                    timeout=TIMEOUT)
    st = dist.PrefixStore(f"run{_next_run()}/", _base_store)
    dist.init_process_group(backend, store=st, rank=RANK, world_size=WORLD, timeout=TIMEOUT)


def env_port() -> int:
    """A MASTER_PORT of its own for a client that makes its group through env://."""
    port = BASE_PORT + 100 + _next_run()
    os.environ["MASTER_PORT"] = str(port)
    return port


def _summed(counter) -> dict:
    """A hicoll.torch counter summed over every live group (world, subgroups, meshes)."""
    out: dict = {}
    for pg in list(dist.distributed_c10d._world.pg_map):
        try:
            counts = counter(pg)
        except ValueError:  # a group without a hicoll backend (plugins before 0.1.0's fix)
            continue
        for op, n in counts.items():
            out[op] = out.get(op, 0) + n
    return out


def fallbacks() -> dict:
    return _summed(ht.fallback_counts)


def hicoll_calls() -> dict:
    return _summed(ht.hicoll_counts)


def finish(losses: list[float], **extra) -> dict:
    """The run's result; destroys the group."""
    res = {"losses": losses, "fallbacks": fallbacks(), "hicoll": hicoll_calls(), **extra}
    if dist.is_initialized():
        dist.destroy_process_group()
    return res


def avg(loss: torch.Tensor) -> float:
    t = loss.detach().clone()
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return (t / WORLD).item()


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32),
                               torch.nn.ReLU(), torch.nn.Linear(32, 4))


def batch(step: int, per_rank: int = 4):
    g = torch.Generator().manual_seed(1000 * step + RANK)
    return torch.randn(per_rank, 16, generator=g), torch.randn(per_rank, 4, generator=g)


def train_loop(model, opt, steps: int = STEPS) -> list[float]:
    losses = []
    for s in range(steps):
        x, y = batch(s)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(avg(loss))
    return losses


# ------------------------------------------------------------------------------------------
def ddp(backend: str) -> dict:
    init(backend)
    model = torch.nn.parallel.DistributedDataParallel(mlp())
    losses = train_loop(model, torch.optim.SGD(model.parameters(), lr=0.05))
    return finish(losses)


def fsdp1(backend: str) -> dict:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    init(backend)
    model = FSDP(mlp(), use_orig_params=True, device_id=torch.device("cpu"))  # CPU: named
    losses = train_loop(model, torch.optim.Adam(model.parameters(), lr=1e-3))
    return finish(losses)


def fsdp2_hsdp_dcp(backend: str) -> dict:
    """FSDP2 with HSDP (replicate x shard mesh) for 3 steps, a DCP save, 2 more steps, a DCP
    load (parameters must come back exactly), then the 2 steps again: losses must repeat."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    init(backend)
    shape = (2, WORLD // 2) if WORLD >= 4 else (1, WORLD)
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=("replicate", "shard"))
    model = mlp()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = train_loop(model, opt, 3)
    ckpt = os.path.join(os.environ["HICOLL_CLIENT_TMP"], f"dcp-{backend}")
    dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=ckpt)
    saved = {k: v.full_tensor().clone() for k, v in get_model_state_dict(model).items()}
    after = train_loop(model, opt, 2)
    state = {"model": get_model_state_dict(model)}
    dcp.load(state, checkpoint_id=ckpt)
    set_model_state_dict(model, state["model"])
    for k, v in get_model_state_dict(model).items():
        assert torch.equal(v.full_tensor(), saved[k]), f"DCP load: {k} differs from the saved value"
    again = train_loop(model, opt, 2)
    assert again == after, f"after the DCP load the losses do not repeat: {again} vs {after}"
    return finish(losses + after + again)


def _reset_accelerate() -> None:
    from accelerate.state import AcceleratorState, GradientState, PartialState
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    PartialState._reset_state()


def hf_trainer(backend: str) -> dict:
    """transformers.Trainer (DDP on CPU). Trainer refuses ddp_backend='hicoll' on CPU, so the
    group is made first (the documented path); Trainer then uses it."""
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
    init(backend)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=1,
                                       n_head=2))
    g = torch.Generator().manual_seed(7)
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 64, (8 * WORLD, 16), generator=g)]
    args = TrainingArguments(
        output_dir=os.path.join(os.environ["HICOLL_CLIENT_TMP"], f"hf-{backend}"),
        per_device_train_batch_size=2, max_steps=STEPS, logging_steps=1, learning_rate=1e-3,
        report_to=[], use_cpu=True, save_strategy="no", seed=0, disable_tqdm=True,
        dataloader_num_workers=0)
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    res = finish(losses)
    _reset_accelerate()
    return res


def accelerate_ddp(backend: str) -> dict:
    """accelerate.Accelerator(cpu=True) on a group made first (cpu=True forces gloo if it
    makes the group itself)."""
    from accelerate import Accelerator
    init(backend)
    acc = Accelerator(cpu=True)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model, opt = acc.prepare(model, opt)
    losses = []
    for s in range(STEPS):
        x, y = batch(s)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        acc.backward(loss)
        opt.step()
        losses.append(avg(loss))
    # accelerate names the backend of a group it did not make "gloo" on CPU, whatever it is.
    res = finish(losses, reported_backend=acc.state.backend)
    _reset_accelerate()
    return res


def lightning_ddp(backend: str) -> dict:
    """Lightning DDPStrategy(process_group_backend=backend): Lightning makes the group
    (env://, torchrun environment)."""
    import lightning as L
    from lightning.pytorch.strategies import DDPStrategy
    env_port()
    losses: list[float] = []

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = mlp()

        def training_step(self, b, i):
            loss = torch.nn.functional.mse_loss(self.net(b[0]), b[1])
            losses.append(avg(loss))
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return STEPS

        def __getitem__(self, i):
            x, y = batch(i)
            return x, y

    trainer = L.Trainer(accelerator="cpu", devices=WORLD, num_nodes=1, max_steps=STEPS,
                        strategy=DDPStrategy(process_group_backend=backend), logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, use_distributed_sampler=False)
    loader = torch.utils.data.DataLoader(Data(), batch_size=None)
    trainer.fit(Module(), loader)
    assert dist.get_backend() == backend, dist.get_backend()
    return finish(losses)


def lightning_model_parallel(backend: str) -> dict:
    """Lightning ModelParallelStrategy(process_group_backend=backend): FSDP2 (fully_shard on
    the strategy's data-parallel mesh) in configure_model."""
    import lightning as L
    from lightning.pytorch.strategies import ModelParallelStrategy
    from torch.distributed.fsdp import fully_shard
    env_port()
    losses: list[float] = []

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = mlp()

        def configure_model(self):
            mesh = self.device_mesh["data_parallel"]
            for layer in self.net:
                if isinstance(layer, torch.nn.Linear):
                    fully_shard(layer, mesh=mesh)
            fully_shard(self.net, mesh=mesh)

        def training_step(self, b, i):
            loss = torch.nn.functional.mse_loss(self.net(b[0]), b[1])
            losses.append(avg(loss))
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    trainer = L.Trainer(accelerator="cpu", devices=WORLD, num_nodes=1, max_steps=STEPS,
                        strategy=ModelParallelStrategy(data_parallel_size=WORLD,
                                                       tensor_parallel_size=1,
                                                       process_group_backend=backend),
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, use_distributed_sampler=False)
    trainer.fit(Module(), torch.utils.data.DataLoader(_Steps(), batch_size=None))
    assert dist.get_backend() == backend, dist.get_backend()
    return finish(losses)


class _Steps(torch.utils.data.Dataset):
    def __len__(self):
        return STEPS

    def __getitem__(self, i):
        return batch(i)


def deepspeed_zero3(backend: str) -> dict:
    """DeepSpeed ZeRO-3 with deepspeed.init_distributed(dist_backend=backend), CPU accelerator."""
    import deepspeed
    import deepspeed.comm.comm as dscomm
    from deepspeed.utils import groups
    # DeepSpeed caches its groups in module globals: forget the previous run's (destroyed) ones.
    dscomm.cdb = None
    for name, value in list(vars(groups).items()):
        if name.startswith("_") and name.isupper() and ("GROUP" in name or name.startswith("_MPU")):
            setattr(groups, name, {} if isinstance(value, dict) else None)
    port = env_port()
    # What DeepSpeed checks before it would try MPI discovery (a client run before may unset some).
    os.environ.update(RANK=str(RANK), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(RANK),
                      MASTER_ADDR="127.0.0.1")
    deepspeed.init_distributed(dist_backend=backend, distributed_port=port, verbose=False)
    assert dist.get_backend() == backend, dist.get_backend()
    model = mlp()
    cfg = {"train_batch_size": 4 * WORLD, "train_micro_batch_size_per_gpu": 4,
           "zero_optimization": {"stage": 3}, "zero_allow_untested_optimizer": True,
           "steps_per_print": 1000}
    engine, _, _, _ = deepspeed.initialize(model=model, config=cfg,
                                           optimizer=torch.optim.SGD(model.parameters(), lr=0.05))
    losses = []
    for s in range(STEPS):
        x, y = batch(s)
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(avg(loss))
    res = finish(losses)
    dscomm.cdb = None
    return res


def _pipeline(backend: str, schedule: str) -> dict:
    """torch.distributed.pipelining: one stage per rank (each a Linear + ReLU of a model every
    rank builds from one seed), 4 microbatches per step, the last stage's loss broadcast."""
    from torch.distributed import pipelining as pp
    init(backend)
    torch.manual_seed(0)
    blocks = [torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()) for _ in range(WORLD)]
    block = blocks[RANK]
    stage = pp.PipelineStage(block, RANK, WORLD, torch.device("cpu"))
    cls = {"gpipe": pp.ScheduleGPipe, "1f1b": pp.Schedule1F1B}[schedule]
    sched = cls(stage, n_microbatches=4, loss_fn=torch.nn.functional.mse_loss)
    opt = torch.optim.SGD(block.parameters(), lr=0.05)
    last = WORLD - 1
    losses = []
    for s in range(STEPS):
        g = torch.Generator().manual_seed(1000 * s)
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 16, generator=g)
        opt.zero_grad()
        mb_losses: list = []
        if RANK == 0:
            sched.step(x)
        elif RANK == last:
            sched.step(target=y, losses=mb_losses)
        else:
            sched.step()
        opt.step()
        loss = torch.stack(mb_losses).mean().detach().reshape(1) if RANK == last else torch.zeros(1)
        dist.broadcast(loss, src=last)
        losses.append(loss.item())
    return finish(losses)


def pipeline_fsdp2(backend: str) -> dict:
    """PP x FSDP2: 2 stages (1F1B) x WORLD / 2-way FSDP2 (a (pp, dp) device mesh: the stages
    talk across nodes, the shards within one); each dp replica trains on its slice."""
    from torch.distributed import pipelining as pp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    init(backend)
    dp = WORLD // 2
    mesh = init_device_mesh("cpu", (2, dp), mesh_dim_names=("pp", "dp"))
    stage_idx, dp_rank = mesh["pp"].get_local_rank(), mesh["dp"].get_local_rank()
    torch.manual_seed(0)
    blocks = [torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
              for _ in range(2)]
    block = fully_shard(blocks[stage_idx], mesh=mesh["dp"])
    stage = pp.PipelineStage(block, stage_idx, 2, torch.device("cpu"), group=mesh.get_group("pp"))
    sched = pp.Schedule1F1B(stage, n_microbatches=2, loss_fn=torch.nn.functional.mse_loss)
    opt = torch.optim.SGD(block.parameters(), lr=0.05)
    losses = []
    for s in range(STEPS):
        g = torch.Generator().manual_seed(1000 * s)
        x, y = torch.randn(4 * dp, 16, generator=g), torch.randn(4 * dp, 16, generator=g)
        x, y = x[4 * dp_rank:4 * dp_rank + 4], y[4 * dp_rank:4 * dp_rank + 4]
        opt.zero_grad()
        mb_losses: list = []
        if stage_idx == 0:
            sched.step(x)
        else:
            sched.step(target=y, losses=mb_losses)
        opt.step()
        loss = torch.stack(mb_losses).mean().detach().reshape(1) if stage_idx == 1 else torch.zeros(1)
        dist.all_reduce(loss)  # the dp replicas' losses, from the last stage
        losses.append(loss.item() / dp)
    return finish(losses)


def ring_attention(backend: str) -> dict:
    """Context parallelism as ring attention runs it: each rank holds a slice of the sequence;
    the K/V blocks go round the ring with batch_isend_irecv (to the next rank, from the
    previous, the next block in flight while this one is folded in), and each rank folds every
    block into its slice's attention with the online softmax. Checked against full attention
    over the whole sequence; gradients through the queries, averaged as DDP does."""
    import math
    init(backend)
    torch.manual_seed(0)
    d, n = 16, 8  # head dimension, tokens per rank
    proj = torch.nn.Linear(16, 3 * d)
    opt = torch.optim.SGD(proj.parameters(), lr=0.05)
    nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    losses, max_err = [], 0.0
    for s in range(STEPS):
        g = torch.Generator().manual_seed(1000 * s)
        x_all, y_all = torch.randn(WORLD * n, 16, generator=g), torch.randn(WORLD * n, d, generator=g)
        mine = slice(RANK * n, (RANK + 1) * n)
        q, k, v = proj(x_all[mine]).split(d, dim=1)
        kv = torch.cat([k, v], dim=1).detach().contiguous()
        m = torch.full((n, 1), float("-inf"))
        l, acc = torch.zeros(n, 1), torch.zeros(n, d)
        for hop in range(WORLD):
            if hop < WORLD - 1:
                nxt_kv = torch.empty_like(kv)
                reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, kv, nxt), dist.P2POp(dist.irecv, nxt_kv, prv)])
            kb, vb = kv.split(d, dim=1)
            scores = q @ kb.T / math.sqrt(d)
            m_new = torch.maximum(m, scores.max(dim=1, keepdim=True).values)
            p, scale = torch.exp(scores - m_new), torch.exp(m - m_new)
            l, acc, m = l * scale + p.sum(dim=1, keepdim=True), acc * scale + p @ vb, m_new
            if hop < WORLD - 1:
                for r in reqs:
                    r.wait()
                kv = nxt_kv
        out = acc / l
        with torch.no_grad():
            qa, ka, va = proj(x_all).split(d, dim=1)
            ref = torch.softmax(qa @ ka.T / math.sqrt(d), dim=1) @ va
            max_err = max(max_err, (out - ref[mine]).abs().max().item())
        loss = torch.nn.functional.mse_loss(out, y_all[mine])
        opt.zero_grad()
        loss.backward()
        for prm in proj.parameters():
            dist.all_reduce(prm.grad)
            prm.grad /= WORLD
        opt.step()
        losses.append(avg(loss))
    assert max_err < 1e-5, f"ring attention differs from full attention by {max_err}"
    return finish(losses, max_err=max_err)


def pipeline_gpipe(backend: str) -> dict:
    return _pipeline(backend, "gpipe")


def pipeline_1f1b(backend: str) -> dict:
    return _pipeline(backend, "1f1b")


CLIENTS = {"ddp": ddp, "fsdp1": fsdp1, "fsdp2_hsdp_dcp": fsdp2_hsdp_dcp, "hf_trainer": hf_trainer,
           "accelerate": accelerate_ddp, "lightning_ddp": lightning_ddp,
           "lightning_model_parallel": lightning_model_parallel, "deepspeed_zero3": deepspeed_zero3,
           "pipeline_gpipe": pipeline_gpipe, "pipeline_1f1b": pipeline_1f1b, "pipeline_fsdp2": pipeline_fsdp2,
           "ring_attention": ring_attention}


def run(clients: list[str] | None = None) -> dict:
    torch.set_num_threads(1)
    # One folder for every rank (DCP writes a checkpoint they share), named by the run's port.
    os.environ.setdefault("HICOLL_CLIENT_TMP", os.path.join(tempfile.gettempdir(),
                                                            f"hicoll-clients-{BASE_PORT}"))
    out = {}
    for name in clients or list(CLIENTS):
        out[name] = {}
        for backend in ("gloo", "hicoll"):
            try:
                out[name][backend] = CLIENTS[name](backend)
            except Exception:  # noqa: BLE001 -- reported per client by the test
                out[name][backend] = {"error": traceback.format_exc()[-3000:]}
                if dist.is_initialized():
                    dist.destroy_process_group()
    return out
