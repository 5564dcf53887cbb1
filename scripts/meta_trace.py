"""A training step's allocations in order, without a GPU: the setup of scripts/measure_gpu_memory.py
run on PyTorch's `meta` device (shapes only, no data, no arithmetic), every storage an op creates
and the moment it is freed written as the CUDA allocator would see them, in the trace format of
`--trace-steps` (`alloc ID BYTES`, `free ID BYTES`, `step N`), for memfit-plan's
`replay_allocator` example (issue 31: the caching allocator's pool under lengths that vary).

What it sees is the order of the real code — transformers' model, PEFT's adapters, checkpointing's
recomputation, the loss, autograd freeing what backward no longer needs, AdamW — which is what a
modelled step lacked. What it cannot see, and replaces:
- flash attention's kernels (`FlashShapes`): on the meta device `scaled_dot_product_attention`
  takes the math path, which materialises the score matrix; the stand-in allocates what flash-attn
  2 does (the output and the f32 log-sum-exp saved for backward; in backward dq, dk, dv and the
  f32 dq accumulator and softmax row sums over the length rounded up to 128). Where the card
  takes the math path too — f32 with grouped key/value heads, which transformers passes as
  `enable_gqa` and neither fused kernel takes — transformers' own SDPA runs;
- dropout: on the meta device `F.dropout` decomposes into a mask of the input's dtype that
  backward keeps; the card's fused kernel keeps a bool mask (`native_dropout`), which
  `cuda_dropout` makes it call;
- AdamW's implementation: PyTorch picks the multi-tensor (`foreach`) one for CUDA tensors only,
  whose temporaries span every parameter at once; measure_gpu_memory.py asks for it on meta;
- autocast (it has no meta device): the one cast it makes on these rows' path, cross-entropy's
  fp32 copy of the logits, is made explicitly (measure_gpu_memory.training_loss);
- the CUDA context and cuBLAS's workspace (outside the caching allocator's trace anyway), and
  kernels' own scratch allocations made inside C++ without an op (none on this path that the card's
  trace shows as a separate block is known; the replay against a card's trace is the check).
"""

import gzip
import os
import weakref


class MetaTrace:
    """Follows, from construction on, each storage an op creates (not views: an output sharing an
    input's storage) and its release: the bytes live and their peak (`peak`, what
    `torch.cuda.max_memory_allocated` counts, less its 512-byte rounding) and, where the setup asks
    for `trace_steps`, the trace of those steps in `DIR/ID.trace.gz`; `step(i)` marks the start of
    step i."""

    def __init__(self, setup):
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        self.steps = setup.get("trace_steps") or 0
        self.path = os.path.join(setup.get("trace_dir") or ".", f"{setup.get('id', 'run')}.trace.gz")
        self.file = gzip.open(self.path + ".tmp", "wt") if self.steps else None
        self.live = {}  # storage id -> bytes
        self.bytes = self.peak = 0
        self.recording = True
        trace = self

        class Recorder(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                trace.record(torch, args, kwargs, out)
                return out

        cuda_dropout()
        self.mode = Recorder()
        self.mode.__enter__()

    def record(self, torch, args, kwargs, out):
        """Counts (and writes) the storages of `out` that no input has."""
        if not self.recording:
            return
        inputs = {id_of(t) for t in tensors(torch, (args, kwargs))}
        for t in tensors(torch, out):
            key = id_of(t)
            storage = t.untyped_storage()
            size = storage.nbytes()
            if key in inputs or key in self.live or size == 0:
                continue
            self.live[key] = size
            self.bytes += size
            self.peak = max(self.peak, self.bytes)
            self.write(f"alloc {key:x} {size}")
            # storages keep their Python object while they live (PyObject preservation), so
            # this runs when the storage itself is freed
            weakref.finalize(storage, self.freed, key)

    def freed(self, key):
        size = self.live.pop(key, None)
        if size is not None and self.recording:
            self.bytes -= size
            self.write(f"free {key:x} {size}")

    def write(self, line):
        if self.file is not None:
            self.file.write(line + "\n")

    def step(self, index):
        """Step `index` starts: marked in the trace, which ends before step `trace_steps`."""
        if self.file is not None and index >= self.steps:
            self.file.close()
            self.file = None
            os.replace(self.path + ".tmp", self.path)
        self.write(f"step {index}")

    def close(self):
        """Stops following the allocations (and puts the trace in place)."""
        self.step(self.steps)
        if self.recording:
            self.mode.__exit__(None, None, None)
            self.recording = False


def id_of(t):
    return t.untyped_storage()._cdata


def tensors(torch, value):
    """The tensors in a nest of tuples, lists and dicts."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from tensors(torch, v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from tensors(torch, v)


def cuda_dropout():
    """Makes `torch.nn.functional.dropout` on meta tensors allocate what CUDA's fused kernel does."""
    import torch
    import torch.nn.functional as F

    composite = F.dropout

    def dropout(input, p=0.5, training=True, inplace=False):
        if input.is_meta and training and 0 < p < 1 and not inplace:
            return torch.native_dropout(input, p, True)[0]
        return composite(input, p, training, inplace)

    F.dropout = dropout


def register_flash_shapes():
    """Registers transformers attention `memfit_fa2_shapes` (the stand-in for flash attention on
    the meta device; a name with "flash" in it would be taken for a hub kernel) and returns its
    name."""
    import torch
    from transformers import AttentionInterface

    class FlashShapes(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):  # [batch, length, heads, head dim], as flash-attn takes them
            out = torch.empty_like(q)
            lse = q.new_empty(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32)
            ctx.save_for_backward(q, k, v, out, lse)
            return out

        @staticmethod
        def backward(ctx, grad):
            q, k, v, out, lse = ctx.saved_tensors
            b, s, h, d = q.shape
            rounded = -(-s // 128) * 128
            dq_accum = q.new_empty(b, rounded, h, d, dtype=torch.float32)
            softmax_d = q.new_empty(b, h, rounded, dtype=torch.float32)
            dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
            del dq_accum, softmax_d
            return dq, dk, dv

    def attention(module, query, key, value, attention_mask, **kwargs):
        if query.dtype == torch.float32 and key.shape[1] != query.shape[1]:
            from transformers.integrations.sdpa_attention import sdpa_attention_forward

            return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
        # transformers passes [batch, heads, length, head dim]; flash-attn works on the transpose
        out = FlashShapes.apply(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2))
        return out, None

    AttentionInterface.register("memfit_fa2_shapes", attention)
    return "memfit_fa2_shapes"
