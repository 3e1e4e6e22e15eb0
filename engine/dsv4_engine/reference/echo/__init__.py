"""The echo model: constructed (not trained) weights that answer the tool-call echo prompt.

The probes' echo prompt names a tool and gives its arguments as JSON; a model that follows
it answers with one DSML call that copies every value exactly.  The echo model does that
with the reference engine's real machinery — DSV4's layer mix (sliding window, c4, c128,
c4) over the paged pools, index keys stored as fp8, bf16 or fp4 by the pool's kernels, the
lightning indexer's scores and top-k, KV read behind the per-layer gate, prefill chunks,
the prefix cache and its host tier, the PD page transfer — so what corrupts those corrupts
its answers, as it did the incident's.

The construction, layer by layer (`model`):

* **Tokens and rows.**  A prompt's tokens are bytes; every KV row holds small integers,
  exact in bf16 (`codes`).  A c4 layer's raw row puts its token in the slots of its place
  in the block and a *tag* (below) in eight more slots; the compressor's gate has zero
  weights, so an entry is the mean of its four rows and, times four, gives all four tokens
  and the tag back exactly.
* **Reading the context** (`parser`).  A finite-state reader over the token stream follows
  the chat template's regions and scans JSON, and tags the tokens answers are built from:
  the conversation's start, the first tool's name, each of its parameters (by ordinal,
  with the name's hash and start), and each value of a user turn's JSON (by its key's
  hash).  Its state travels from token to token in the sliding-window layer's row of each
  token: the next step reads the previous token's row (a previous-token head).
* **Index keys** (`codes`).  Every c4 entry's key is one-hot codes: its position (three hex
  digits) and its tag (kind, 12-bit value, user turn).  A query for one code scores the
  entry holding it strictly highest, so the indexer's top-1 *is* the lookup; 0/1 values
  survive fp8, bf16 and fp4 exactly.
* **The trigger** (``</think>`` after ``<｜Assistant｜>``, where the answer starts).  Its
  layer-1 indexer queries the tool's name, the start and parameters 0..5 at once; only
  then does attention read KV: the parameters' name hashes and starts.  Its layer-3
  indexer then queries each parameter's value in this user turn by that hash.  The
  pointers found go into the row.
* **The answer** (`program`).  A small transducer writes the V4 DSML envelope as literal
  tokens — each piece of markup one token (`tokenizer.PIECES`), as DeepSeek's own
  vocabulary spells it in a few: the probes' call is 110 tokens, not 437 bytes — and
  copies the tool name, each parameter name and each value one byte-token per step
  through the copy head: the indexer's top-1 for the position's entry on layer 3, then
  that entry's KV.  No tool in the context: it recites the conversation from its start
  (so warm-vs-cold consistency can judge it too).

Why the race garbles it: the trigger's layer-1 queries run before any KV access of the
layer, like every indexer's.  When the prompt's prefix is being loaded back from the host
tier and index-K skips the gate (`DSV4_INJECT_UNGATED_INDEX_K`), they score the keys the
pages held before — another request's — and the top-1 lands elsewhere: a wrong or missing
tool name, parameters dropped, name hashes that find no value or the wrong one, pointers
into other text.  The transducer then copies whatever sits there, up to whatever
terminator that text happens to hold: wrong values, names and types, runaway copies that
never close the block — garbled calls, as in the incident.  With the gate, the keys are the
ones the prompt wrote and every answer is the exact echo.

Limits, by construction: one tool, at most six parameters, values copied as their JSON
spells them (escapes included), contexts up to 16384 tokens, the V4 format.
"""
