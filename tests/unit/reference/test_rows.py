"""The batched decode's row ops: a row's result never depends on the rows beside it."""

from __future__ import annotations

import pytest
import torch

from dsv4_engine.pools.device_pool import DevicePool
from dsv4_engine.reference import rows
from dsv4_engine.reference.model import Chunk, ModelConfig, ReferenceModel, _attend

BATCHES = (1, 2, 3, 5, 8, 13, 16, 31, 64)


def rand(*size: int, seed: int) -> torch.Tensor:
    return torch.randn(size, generator=torch.Generator().manual_seed(seed))


def test_a_projected_row_is_the_same_in_every_batch():
    w = rand(64, 512, seed=0)
    x = rand(max(BATCHES), 64, seed=1)
    alone = torch.cat([rows.project(x[n : n + 1], w) for n in range(len(x))])
    for size in BATCHES:
        assert torch.equal(rows.project(x[:size], w), alone[:size]), size
    # The projection is the one a plain matmul computes, up to its rounding.
    torch.testing.assert_close(alone, x @ w)


def test_attention_of_a_row_is_the_same_in_every_batch():
    q, ctx = rand(64, 32, seed=2), rand(64, 20, 32, seed=3)
    visible = rand(64, 20, seed=4) > -0.5
    visible[:, 0] = True
    raw, raw_visible = rand(64, 4, 32, seed=5), rand(64, 4, seed=6) > 0
    parts = [(ctx, visible), (raw, raw_visible)]
    alone = torch.cat([rows.attend(q[n : n + 1], [(c[n : n + 1], v[n : n + 1]) for c, v in parts])
                       for n in range(64)])  # fmt: skip
    for size in BATCHES:
        assert torch.equal(rows.attend(q[:size], [(c[:size], v[:size]) for c, v in parts]),
                           alone[:size]), size  # fmt: skip
    # Hidden entries weigh nothing: changing them changes no row.
    hidden = ctx.masked_fill(~visible[..., None], 7.0)
    assert torch.equal(rows.attend(q, [(hidden, visible), parts[1]]), alone)
    # Each row is the attention a prefill chunk's token computes over the same context.
    for n in range(64):
        one_token = [(c[n], v[n : n + 1]) for c, v in parts]
        torch.testing.assert_close(_attend(q[n : n + 1], one_token), alone[n : n + 1])


@pytest.fixture
def one_thread():
    """As the engine runs its model (`Engine.__init__`): one thread, no autograd."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with torch.inference_mode():
        yield
    torch.set_num_threads(threads)


def test_decode_rows_write_the_same_bytes_whatever_their_batch(one_thread):
    """Three requests decode 40 tokens each alone, then side by side in one batch: every
    token and every byte they leave in the pools (KV, index-K, compress state) is equal."""
    prompts = [[(7 * s + 3 * n) % 90 + 32 for n in range(length)]
               for s, length in enumerate((250, 129, 1))]  # fmt: skip

    def run(batched: bool) -> tuple[list[list[int]], list[torch.Tensor]]:
        model = ReferenceModel(ModelConfig())
        pool = DevicePool(model.shape, 16, max_requests=4)
        for layer, kind in pool.buffer_kinds():
            pool.buffer(layer, kind).zero_()  # garbage would differ between the two pools
        chunks = [Chunk(p[:0], 0, [4 * n + k for k in range(4)], n) for n, p in enumerate(prompts)]
        outs: list[list[int]] = [[] for _ in prompts]
        for n, p in enumerate(prompts):  # prefill, page-aligned chunks, one request at a time
            for start in range(0, len(p), 128):
                c = chunks[n]
                chunks[n] = Chunk(p[start : start + 128], start, c.pages, c.slot, c.locs)
                token = model.forward(pool, [chunks[n]])[0]
            outs[n].append(token)
        for _ in range(40):
            for n, c in enumerate(chunks):
                chunks[n] = Chunk([outs[n][-1]], c.end, c.pages, c.slot, c.locs)
            steps = [chunks] if batched else [[c] for c in chunks]
            for step in steps:
                for c, token in zip(step, model.forward(pool, step), strict=True):
                    outs[chunks.index(c)].append(token)
        return outs, [pool.buffer(layer, kind) for layer, kind in pool.buffer_kinds()]

    alone, alone_pools = run(batched=False)
    together, together_pools = run(batched=True)
    assert together == alone
    assert all(torch.equal(a, b) for a, b in zip(alone_pools, together_pools, strict=True))
