"""The ``lm`` workload: a small byte-level GPT on Python's own documentation text.

The text is ``pydoc_data.topics`` (ships with every CPython: about 465k
characters of English and code, so nothing is downloaded; its exact content
follows the Python version). Bytes are tokens (vocabulary 256). The last 10%
of the text is the validation set; each worker trains on random windows of
its own contiguous tenth-of-the-rest shard.

The model follows nanoGPT's shape: token and position embeddings, pre-norm
blocks of causal self-attention and a 4x GELU MLP, a final LayerNorm, the
output head tied to the token embedding. Default: 4 layers, 4 heads, width
256, context 64, about 3.2M parameters (12.7 MB per message in float32).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 256
CONTEXT = 64
VAL_FRACTION = 0.1
EVAL_WINDOWS = 128  # validation windows (of CONTEXT bytes) per evaluation: 8,192 predicted bytes


@dataclass(frozen=True)
class GPTConfig:
    n_layer: int = 4
    n_head: int = 4
    width: int = 256
    context: int = CONTEXT
    vocab: int = VOCAB


def load_text(val_fraction: float = VAL_FRACTION) -> tuple[torch.Tensor, torch.Tensor]:
    """(train bytes, validation bytes) as int64 tensors."""
    from pydoc_data.topics import topics

    data = "\n\n".join(topics[key] for key in sorted(topics)).encode("utf-8")
    tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
    split = int(len(tokens) * (1 - val_fraction))
    return tokens[:split], tokens[split:]


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.width, 3 * config.width)
        self.proj = nn.Linear(config.width, config.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        q, k, v = (t.view(batch, length, self.n_head, width // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, length, width))


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(config.width)
        self.attn = CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(config.width)
        self.mlp = nn.Sequential(nn.Linear(config.width, 4 * config.width), nn.GELU(),
                                 nn.Linear(4 * config.width, config.width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Byte-level causal language model; ``forward(x)`` maps (B, T) bytes to (B, T, 256) logits."""

    def __init__(self, config: GPTConfig = GPTConfig()):
        super().__init__()
        self.config = config
        self.token = nn.Embedding(config.vocab, config.width)
        self.position = nn.Embedding(config.context, config.width)
        self.blocks = nn.Sequential(*(Block(config) for _ in range(config.n_layer)))
        self.ln = nn.LayerNorm(config.width)
        self.head = nn.Linear(config.width, config.vocab, bias=False)
        self.head.weight = self.token.weight  # tied
        self.apply(self._init)
        for name, param in self.named_parameters():  # GPT-2's scaled init of residual projections
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(x.shape[1], device=x.device)
        h = self.blocks(self.token(x) + self.position(positions))
        return self.head(self.ln(h))


class TextSampler:
    """Endless random windows (x: bytes t..t+T-1, y: bytes t+1..t+T) from worker ``rank``'s shard."""

    def __init__(self, train: torch.Tensor, rank: int, world_size: int, batch_size: int, seed: int,
                 context: int = CONTEXT, shards: int | None = None):
        shards = world_size if shards is None else shards  # 1: every worker the whole text
        shard = len(train) // shards
        self.tokens = train[(rank % shards) * shard : (rank % shards + 1) * shard]
        self.context = context
        self.batch_size = batch_size
        self.gen = torch.Generator().manual_seed(seed * 1_000_003 + rank)
        if len(self.tokens) <= context + 1:
            raise ValueError(f"a shard of {len(self.tokens)} bytes is too small for windows of {context}")

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(0, len(self.tokens) - self.context - 1, (self.batch_size,), generator=self.gen)
        offsets = starts[:, None] + torch.arange(self.context + 1)
        window = self.tokens[offsets]
        return window[:, :-1], window[:, 1:]

    def state_dict(self) -> dict:
        """Where the endless stream is (for checkpoints): the windows are drawn from this generator only."""
        return {"generator": self.gen.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.gen.set_state(state["generator"])



def validation_windows(val: torch.Tensor, context: int = CONTEXT, count: int = EVAL_WINDOWS):
    """The fixed validation set: ``count`` evenly spaced windows (x, y) of the validation text."""
    stride = max(1, (len(val) - context - 1) // count)
    starts = torch.arange(count) * stride
    offsets = starts[:, None] + torch.arange(context + 1)
    window = val[offsets]
    return window[:, :-1], window[:, 1:]
