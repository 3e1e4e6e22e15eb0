"""The CPU reference engine: a tiny DeepSeek-V4-shaped model served over the OpenAI API.

It runs on the project's real pools, HiCache host tier, per-layer gate and kernels, so
the corruption a bug causes there is the corruption served to a client.  Modules:
`tokenizer` and `chat` (prompt in), `model` (forward pass over paged pools), `radix`
(prefix cache over pages, evicting to the host tier), `engine` (the scheduler thread),
`server` (HTTP), `pd` (prefill → decode page transfer over TCP), `router` (PD router),
`loadgen` (the shared-prefix workload of the tests and the benchmark).

Serving: `engine` batches continuously — each step is one forward, layer by layer across the
batch, over a page-aligned prefill chunk of every request still in prefill or, when none
is, one decode token of every running request; the echo model's copy heads look their
entries up for the whole batch at once.  Each step starts one HiCache host→device load for
every page its new requests need back, and the forward runs while it lands: the simulated
copy costs ``--hicache-layer-latency`` per layer, then its bytes at ``--hicache-bandwidth``
(64 MB/s by default: fast enough that a gated engine's loads do not cap its throughput).
A load that draws the injected race (``DSV4_INJECT_UNGATED_INDEX_K``) lands each layer's
index-K only once the step has done its index-K reads of that layer (its first KV access
of it), and its pages hold other pages' keys until then: every ungated indexer read of
that step reads stale keys, however loaded the machine (`hicache.transfer`).

Running it (every process is ready when ``GET /health`` answers 200)::

    dsv4-engine serve --port 30000 --enable-hierarchical-cache --hicache-ratio 2 \\
        --index-dtype bf16                                    # null mode: one process
    dsv4-engine serve --port 30001 --disaggregation-mode prefill \\
        --disaggregation-bootstrap-port 8998 --enable-hierarchical-cache --hicache-ratio 2
    dsv4-engine serve --port 30002 --disaggregation-mode decode
    dsv4-engine router --port 30000 --prefill http://127.0.0.1:30001 8998 \\
        --decode http://127.0.0.1:30002

``DSV4_INJECT_UNGATED_INDEX_K=1`` in a server's environment removes the index-K gate.
"""
