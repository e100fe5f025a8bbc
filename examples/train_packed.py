"""Train a tiny causal language model on packed documents with maskc's document mask.

Every batch packs documents of random lengths into one row of ``seq_len`` tokens; ``document.mask`` keeps
attention causal and inside each document, and is re-bound for every batch (new lengths, same kernel): on the
host (``--bind host``, the default), or on the GPU (``--bind device``: ``bind_on_device`` once, then
``update(docs=lengths)`` every batch, the descriptor built there). ``--cuda-graph`` captures the whole step
(re-bind, forward, backward, optimizer) once and replays it with each batch's tokens and lengths copied in.
The toy corpus: each document repeats a random pattern of 3 to 6 tokens, so after the pattern's first
occurrence every token is predictable by looking back within the document (and only there): the loss falls
only as the model learns to attend.

    python examples/train_packed.py                 # on the GPU if there is one (bf16), else the CPU (float32)
    python examples/train_packed.py --steps 60 --seq-len 96 --cpu
    python examples/train_packed.py --bind device --cuda-graph      # the mask bound on the GPU, one graph a step

On CUDA, attention runs maskc's generated forward and backward kernels; on the CPU, maskc's reference path
(the same mathematics on the dense mask), so the script also runs, at toy size, without a GPU.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch
import torch.nn.functional as F

import maskc

DOCUMENT_MASK = Path(__file__).resolve().parent / "document.mask"
CUDA_GRAPH_NEEDS = "--cuda-graph needs the GPU and --bind device (a host bind is host work in every step)"


def packed_batch(batch: int, seq_len: int, vocab: int, gen: torch.Generator):
    """Tokens (batch, seq_len) of packed documents, each a random pattern repeated, and each row's
    document lengths."""
    tokens = torch.empty(batch, seq_len, dtype=torch.long)
    lengths = []
    for b in range(batch):
        docs, at = [], 0
        while at < seq_len:
            n = min(int(torch.randint(8, max(9, seq_len // 2), (1,), generator=gen)), seq_len - at)
            pattern = torch.randint(0, vocab, (int(torch.randint(3, 7, (1,), generator=gen)),), generator=gen)
            tokens[b, at:at + n] = pattern.repeat(n // len(pattern) + 1)[:n]
            docs.append(n)
            at += n
        lengths.append(docs)
    return tokens, lengths


class Block(torch.nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim, bias=False)
        self.proj = torch.nn.Linear(dim, dim, bias=False)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim))

    def forward(self, x, bound):
        B, S, C = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, S, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        attn = maskc.attention(q, k, v, bound)                  # (B, H, S, D), differentiable
        x = x + self.proj(attn.transpose(1, 2).reshape(B, S, C))
        return x + self.mlp(self.norm2(x))


class TinyLM(torch.nn.Module):
    def __init__(self, vocab: int, dim: int, heads: int, layers: int, max_len: int):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.pos = torch.nn.Embedding(max_len, dim)
        self.blocks = torch.nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.head = torch.nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens, positions, bound):
        x = self.embed(tokens) + self.pos(positions)
        for block in self.blocks:
            x = block(x, bound)
        return self.head(x)


def train(steps: int = 80, seq_len: int = 256, batch: int = 2, vocab: int = 64, dim: int = 128, heads: int = 2,
          layers: int = 2, lr: float = 3e-3, device: str | None = None, seed: int = 0, bind: str = "host",
          cuda_graph: bool = False, log=print) -> list[float]:
    """Train and return the loss of every step. Head dim = dim / heads (64 here: the kernels take 64 or 128).
    ``bind``: "host" binds the mask per batch on the host, "device" binds it on the device once and writes each
    batch's lengths into it; ``cuda_graph`` (GPU, bind "device") replays one captured step per batch."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if cuda_graph and (device != "cuda" or bind != "device"):
        raise ValueError(CUDA_GRAPH_NEEDS)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    mask = maskc.load(DOCUMENT_MASK)
    model = TinyLM(vocab, dim, heads, layers, seq_len).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, capturable=cuda_graph)
    # documents are at least 8 tokens long but the last: at most seq_len // 8 + 1 of them in a row
    on_device = (mask.bind_on_device(seq_len - 1, docs=[[seq_len - 1]] * batch, max_segments=seq_len // 8 + 2,
                                     device=device) if bind == "device" else None)
    tokens = torch.zeros(batch, seq_len, dtype=torch.long, device=device)      # a step's inputs (the graph's)
    positions = torch.zeros_like(tokens)
    lengths = torch.zeros(batch, seq_len // 8 + 2, dtype=torch.int32, device=device)

    def step(host_docs=None):
        attend = on_device.update(docs=lengths) if on_device is not None else input_mask(mask, host_docs, seq_len)
        with torch.autocast(device_type=device, dtype=dtype, enabled=device == "cuda"):
            logits = model(tokens[:, :-1], positions[:, :-1], attend)
            # next-token targets, ignoring the first token of each document (nothing predicts it)
            targets = torch.where(positions[:, 1:] == 0, -100, tokens[:, 1:])
            loss = F.cross_entropy(logits.float().reshape(-1, vocab), targets.reshape(-1), ignore_index=-100)
        loss.backward()
        opt.step()
        return loss.detach()

    def load(batch_tokens, docs):
        tokens.copy_(batch_tokens)
        # position within each document, so that the model can tell documents apart
        positions.copy_(torch.stack([torch.cat([torch.arange(n) for n in row]) for row in docs]))
        lengths.zero_()
        for b, row in enumerate(input_docs(docs)):
            lengths[b, :len(row)] = torch.tensor(row)

    graph = static_loss = None
    losses = []
    for i in range(steps):
        batch_tokens, docs = packed_batch(batch, seq_len, vocab, gen)
        load(batch_tokens, docs)
        if cuda_graph and graph is None:            # warm up on a side stream, then capture one step
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    opt.zero_grad(set_to_none=True)
                    step()
            torch.cuda.current_stream().wait_stream(side)
            opt.zero_grad(set_to_none=True)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=side):
                static_loss = step()
        if graph is not None:
            graph.replay()
            loss = static_loss
        else:
            opt.zero_grad(set_to_none=True)
            loss = step(docs)
        losses.append(loss.item())
        if i % 10 == 0 or i == steps - 1:
            log(f"step {i:3d}  loss {losses[-1]:.3f}  (uniform guess: {math.log(vocab):.3f})")
    if on_device is not None and device == "cuda":
        on_device.check()                           # the lengths were valid (the device checked each step)
    return losses


def input_docs(lengths):
    """The documents of the model's input, tokens[:, :-1]: the same documents, the last one a token shorter."""
    return [d[:-1] + [d[-1] - 1] if d[-1] > 1 else d[:-1] for d in lengths]


def input_mask(mask, lengths, seq_len):
    """The document mask of the model's input, bound on the host. A jagged batch: each row has its own
    lengths; a new bind per batch reuses the kernels."""
    return mask.bind(seq_len=seq_len - 1, docs=input_docs(lengths))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--cpu", action="store_true", help="use the CPU reference path even if there is a GPU")
    ap.add_argument("--bind", choices=["host", "device"], default="host",
                    help="where the mask is bound each batch: the host, or the device (bind_on_device + update)")
    ap.add_argument("--cuda-graph", action="store_true", help="capture one whole step, replay it per batch "
                    "(needs --bind device)")
    args = ap.parse_args()
    device = "cpu" if args.cpu or not torch.cuda.is_available() else "cuda"
    if args.cuda_graph and (device != "cuda" or args.bind != "device"):
        ap.error(CUDA_GRAPH_NEEDS)                  # one line and status 2, not train's ValueError traceback
    losses = train(args.steps, args.seq_len, args.batch, device=device, bind=args.bind,
                   cuda_graph=args.cuda_graph)
    print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f}")


if __name__ == "__main__":
    main()
