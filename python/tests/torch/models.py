"""The models and data of the hsdp.torch tests: a tiny HF GPT2LMHeadModel (vocabulary 256,
tied lm_head) and a hand-written MLP, and deterministic global batches (a function of the step,
the same on every rank)."""

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 2 * d)
        self.proj = nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.proj(torch.nn.functional.gelu(self.fc(self.norm(x))))


class MLP(nn.Module):
    """fc0 -> blocks -> head; the head shares nothing. 16 -> 32 wide, 3 blocks."""

    def __init__(self, d_in: int = 16, d: int = 32, layers: int = 3, checkpointing=False):
        super().__init__()
        self.fc0 = nn.Linear(d_in, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(layers))
        self.head = nn.Linear(d, 1)
        self.checkpointing = checkpointing

    def forward(self, x):
        h = self.fc0(x)
        for b in self.blocks:
            if self.checkpointing and torch.is_grad_enabled():
                h = torch.utils.checkpoint.checkpoint(b, h, use_reentrant=False)
            else:
                h = b(h)
        return self.head(h).squeeze(-1)


class RootMLP(MLP):
    """MLP with parameters of the model's own (hsdp.torch's root unit, named ""): a per-feature
    scale after fc0 and a 0-dim temperature on the output."""

    def __init__(self, checkpointing=False):
        super().__init__(checkpointing=checkpointing)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 32))
        self.temperature = nn.Parameter(torch.tensor(0.8))

    def forward(self, x):
        h = self.fc0(x) * self.scale
        for b in self.blocks:
            if self.checkpointing and torch.is_grad_enabled():
                h = torch.utils.checkpoint.checkpoint(b, h, use_reentrant=False)
            else:
                h = b(h)
        return self.head(h).squeeze(-1) * self.temperature


def gpt2_config(layers: int = 2, d: int = 64, heads: int = 4, context: int = 32):
    from transformers import GPT2Config
    return GPT2Config(vocab_size=256, n_positions=context, n_embd=d, n_layer=layers,
                      n_head=heads, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                      bos_token_id=0, eos_token_id=0)


def build(kind: str, checkpointing: bool = False, layers: int = 2):
    if kind == "gpt2":
        from transformers import GPT2LMHeadModel
        m = GPT2LMHeadModel(gpt2_config(layers=layers))
        if checkpointing:
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return m.train()
    if kind == "mlp_root":
        return RootMLP(checkpointing=checkpointing)
    return MLP(checkpointing=checkpointing)


def global_batch(kind: str, step: int, batch: int, context: int = 32) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + step)
    if kind == "gpt2":
        return torch.randint(0, 256, (batch, context), generator=g)
    return torch.randn(batch, 16, generator=g)


def batch_loss(model, kind: str, x: torch.Tensor) -> torch.Tensor:
    if kind == "gpt2":
        return model(input_ids=x, labels=x).loss
    target = x.sum(-1).sin()
    return torch.nn.functional.mse_loss(model(x), target)


def no_decay_names(model) -> set:
    """AdamW recipes exclude biases, norms and embeddings from weight decay."""
    return {n for n, p in model.named_parameters()
            if n.endswith("bias") or "ln_" in n or "norm" in n or "wpe" in n}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a-b| / max |b|: the tests' distance between a parameter and the reference's."""
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def agreed(comm, ok: bool, line: str) -> bool:
    """Every rank's `ok` agreed over MPI (one failing rank fails all); rank 0 prints `line`
    followed by PASS or FAIL. True when every rank's was."""
    failed = comm.allreduce(0 if ok else 1)  # mpi4py's default op: the sum
    if comm.Get_rank() == 0:
        print(f"{line} {'PASS' if failed == 0 else 'FAIL'}", flush=True)
    return failed == 0


def verdict(comm, ok: bool, line: str, sharded, session) -> int:
    """agreed(), then the model and session closed. The program's exit code."""
    passed = agreed(comm, ok, line)
    sharded.close()
    session.close()
    return 0 if passed else 1
