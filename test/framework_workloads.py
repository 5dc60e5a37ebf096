"""Training code as NeMo-Run users write it with the frameworks they use, run inside the (local cluster's) pods by
test_frameworks.py: PyTorch Lightning DDP, transformers' ``Trainer``, a loop shaped like Megatron-Bridge's
``train_step`` with its step-end callbacks, and Lightning under ft_launcher resuming from ``last.ckpt``. Tiny
models on the CPU (gloo), so that the whole tier runs in minutes on 2 cores.

Shipped to the pods by test_frameworks.py's packager (with nemo_kubeflow/progress.py of this checkout). The
frameworks are imported inside the functions: the test process only names them.

``release_file``: the steps are slow (``step_seconds``) until that file exists, then take no time, so that a
test can look at a running job from new processes however loaded the machine is (the pods share its host).
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def _slow_until_released(release_file: str, step_seconds: float) -> None:
    if step_seconds and not (release_file and os.path.exists(release_file)):
        time.sleep(step_seconds)


def _world() -> tuple[int, int]:
    """Nodes and processes a node, from the variables torchrun (or ft_launcher) set from Trainer's PET_*."""
    world, local = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return max(1, world // max(1, local)), local


# ---------------------------------------------------------------- PyTorch Lightning


def _lightning_module(step_seconds: float, release_file: str, pid_dir: str = ""):
    import pytorch_lightning as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    class Regression(pl.LightningModule):
        """y = 3x + 1, learned by one linear layer."""

        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)
            self.pid_written = False

        def training_step(self, batch, batch_idx):
            if pid_dir and not self.pid_written:  # once per process, from the first step on
                Path(pid_dir, f"rank{self.global_rank}-{os.getpid()}.pid").write_text(str(os.getpid()))
                self.pid_written = True
            _slow_until_released(release_file, step_seconds)
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

        def train_dataloader(self):
            x = torch.linspace(-1, 1, 256).unsqueeze(1)
            return DataLoader(TensorDataset(x, 3 * x + 1), batch_size=8, shuffle=False)

    return Regression()


def _lightning_trainer(steps: int, callbacks: list, **more):
    """Lightning's DDP on the CPU over the torchrun environment: ``num_nodes`` x ``devices`` as the PET variables say."""
    import pytorch_lightning as pl

    nodes, devices = _world()
    return pl.Trainer(
        accelerator="cpu",
        devices=devices,
        num_nodes=nodes,
        strategy="ddp",
        max_steps=steps,
        callbacks=callbacks,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **more,
    )


def lightning_ddp(steps: int, interval: float = 1.0, step_seconds: float = 0.0, release_file: str = "") -> None:
    """Lightning's own DDP over the torchrun environment (``num_nodes`` x ``devices`` as the PET variables say),
    reporting through ``progress.lightning_callback()``."""
    import torch.distributed as dist

    from nemo_kubeflow import progress

    trainer = _lightning_trainer(steps, [progress.lightning_callback(interval=interval)], enable_checkpointing=False)
    model = _lightning_module(step_seconds, release_file)
    trainer.fit(model)
    print(
        f"lightning rank {trainer.global_rank} of {trainer.world_size} (node {trainer.node_rank}): "
        f"{trainer.global_step} steps, process group {dist.get_backend()} of {dist.get_world_size()}, "
        f"strategy {type(trainer.strategy).__name__}, environment {type(trainer.strategy.cluster_environment).__name__}",
        flush=True,
    )


def lightning_fault_tolerant(steps: int, checkpoint_dir: str, pid_dir: str, step_seconds: float = 0.2) -> None:
    """Lightning DDP under ft_launcher: a checkpoint (``last.ckpt``) every 5 steps, resumed from at a restart of
    the ranks (ft_launcher's in-job restart); each process writes ``rank<R>-<pid>.pid`` so a test can kill it."""
    from pytorch_lightning.callbacks import ModelCheckpoint

    from nemo_kubeflow import progress

    last = Path(checkpoint_dir, "last.ckpt")
    resume = str(last) if last.exists() else None
    trainer = _lightning_trainer(
        steps,
        [
            ModelCheckpoint(dirpath=checkpoint_dir, save_last=True, every_n_train_steps=5),
            progress.lightning_callback(interval=1.0),
        ],
    )
    model = _lightning_module(step_seconds, "", pid_dir)
    print(
        f"lightning rank {trainer.global_rank}: {'resuming from ' + resume if resume else 'from scratch'}", flush=True
    )
    trainer.fit(model, ckpt_path=resume)
    print(f"lightning rank {trainer.global_rank} finished at step {trainer.global_step}", flush=True)


# ---------------------------------------------------------------- transformers


def hf_trainer(
    steps: int,
    output_dir: str,
    step_seconds: float = 0.0,
    release_file: str = "",
    ours: bool = False,
    interval: float = 1.0,
) -> None:
    """transformers' ``Trainer`` on a tiny GPT-2 made from its config (nothing downloaded), DDP over gloo as
    accelerate sets it up from the torchrun environment. ``ours``: with ``progress.hf_callback()`` (else only what
    transformers adds by itself: its ``KubeflowCallback`` where Trainer's status server is offered)."""
    import torch
    import torch.distributed as dist
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    from nemo_kubeflow import progress

    class SlowSteps(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            _slow_until_released(release_file, step_seconds)

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64, n_positions=16))
    tokens = torch.randint(0, 64, (128, 16))
    data = [{"input_ids": row, "labels": row} for row in tokens]
    args = TrainingArguments(
        output_dir=output_dir,
        max_steps=steps,
        per_device_train_batch_size=4,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        ddp_backend="gloo" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    callbacks = [SlowSteps(), *([progress.hf_callback(interval=interval)] if ours else [])]
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=callbacks)
    trainer.train()
    names = sorted(type(c).__name__ for c in trainer.callback_handler.callbacks)
    print(
        f"transformers rank {args.process_index} of {args.world_size}: {trainer.state.global_step} steps, "
        f"process group {dist.get_backend() if dist.is_initialized() else None} of "
        f"{dist.get_world_size() if dist.is_initialized() else 1}, model {type(trainer.model_wrapped).__name__}, "
        f"callbacks {','.join(names)}",
        flush=True,
    )


# ---------------------------------------------------------------- a Megatron-Bridge-shaped loop


def megatron_style(steps: int, interval: float = 1.0, step_seconds: float = 0.0, release_file: str = "") -> None:
    """A loop shaped as Megatron-Bridge's ``train()``: a ``GlobalState`` with ``train_state.step`` and
    ``cfg.train.train_iters``, ``train_step`` returning the reduced ``loss_dict``, and the callbacks registered for
    ``on_train_step_end`` called with a context of the state and that dict: here ``progress.step_hook()``,
    registered as its docs say. Without Megatron-Bridge installed: the shapes only."""
    from types import SimpleNamespace

    import torch
    import torch.distributed as dist

    from nemo_kubeflow import progress

    class CallbackManager:
        def __init__(self) -> None:
            self.callbacks: dict[str, list] = {}

        def register(self, event: str, callback) -> None:
            self.callbacks.setdefault(event, []).append(callback)

        def fire(self, event: str, context) -> None:
            for callback in self.callbacks.get(event, []):
                callback(context)

    dist.init_process_group("gloo")
    torch.manual_seed(dist.get_rank())
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    state = SimpleNamespace(
        train_state=SimpleNamespace(step=0), cfg=SimpleNamespace(train=SimpleNamespace(train_iters=steps))
    )
    manager = CallbackManager()
    hook = progress.step_hook(interval=interval)
    manager.register("on_train_step_end", hook)

    def train_step() -> dict:
        x = torch.randn(16, 8)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        optimizer.zero_grad()
        loss.backward()
        for p in model.parameters():  # data parallel by hand: average the gradients
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        optimizer.step()
        reduced = loss.detach().clone()
        dist.all_reduce(reduced)
        return {"lm loss": reduced / dist.get_world_size()}

    while state.train_state.step < state.cfg.train.train_iters:
        loss_dict = train_step()
        state.train_state.step += 1
        manager.fire("on_train_step_end", SimpleNamespace(state=state, loss_dict=loss_dict))
        _slow_until_released(release_file, step_seconds)
    hook.flush()
    print(
        f"megatron-style rank {dist.get_rank()} of {dist.get_world_size()}: {state.train_state.step} steps", flush=True
    )
    dist.destroy_process_group()
