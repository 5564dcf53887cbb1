#!/usr/bin/env python3
"""Replays validation row T2's training step on the CPU — torchtune's April 2024 distributed LoRA
recipe (Llama-2 LoRA on q and v, bf16, FSDP FULL_SHARD over 2 ranks, no checkpointing) — with the
row's own torch and torchtune code, and prints rank 0's peak *allocated* bytes of two micro-batches
(the model built at the row's width with fewer blocks: the per-block slope is what matters).

What it answers: whether the tensors that code keeps (FSDP1's gathered units, the activations, the
loss) are what the estimate counts. What it cannot answer: the CUDA caching allocator's pool (peak
*reserved*, what the row measured), which needs CUDA streams and NCCL (docs/accuracy.md, T2).

The model setup and the step are the recipe's (`recipes/lora_finetune_distributed.py` at torchtune
commit fef3ed10dc9e: `lora_fsdp_wrap_policy`, `mixed_precision=None`, `logits[..., :-1, :]
.contiguous()`, `nn.CrossEntropyLoss`, AdamW stepping every `--accum` micro-batches); two things
differ and neither changes the training step: `sync_module_states` is off (FSDP1 requires it on a
GPU; both ranks seed the same weights instead) and gradient accumulation is 2, not 32 (the LoRA
gradients are a few MiB). The bytes come from the profiler's memory events of the CPU allocator,
summed in time order from the third micro-batch on (the weights and optimizer states exist by
then and are added as `persistent_bytes`). It also counts the blocks holding gathered parameters
whenever the gradient reaches a block's output (`most_blocks_gathered_in_backward`). The figures of
2026-11-27 (2588.8 and 3579.5 MiB at 3 and 6 blocks) are held against the estimate by
`torchtune_fsdp_lora_replay_allocated` in crates/memfit-plan/tests/stacks.rs.

Setup (about 4 GB of wheels; torch 2.2.2 is the row's version):
    python3 -m venv /tmp/t222 && /tmp/t222/bin/pip install torch==2.2.2 omegaconf sentencepiece \
        safetensors huggingface_hub tqdm torchao==0.1 "datasets<3" "numpy<2" "pandas<2.3" "pyarrow<18"
    git -C <torchtune clone> archive fef3ed10dc9efe9e35b118e4397e84c680c0a737 torchtune | tar -x -C /tmp/tt
Run (3 and 6 blocks at Llama-2-7B's width; ~1.5 and ~2.5 minutes on 2 cores):
    OMP_NUM_THREADS=1 /tmp/t222/bin/torchrun --nproc_per_node 2 \
        scripts/replay_torchtune_fsdp_cpu.py --torchtune /tmp/tt --layers 3
"""

import argparse
import json
import sys

import torch
import torch.distributed as dist


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--torchtune", required=True, help="folder holding torchtune's package")
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--intermediate", type=int, default=11008)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--accum", type=int, default=2)
    return p.parse_args()


def build_model(args):
    from torchtune import modules, utils
    from torchtune.models.llama2 import lora_llama2
    from torchtune.modules.peft.peft_utils import get_adapter_params, set_trainable_params
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    torch.manual_seed(0)
    with utils.set_default_dtype(torch.bfloat16):
        model = lora_llama2(
            ["q_proj", "v_proj"],
            vocab_size=args.vocab,
            num_layers=args.layers,
            num_heads=args.hidden // 128,
            num_kv_heads=args.hidden // 128,
            embed_dim=args.hidden,
            max_seq_len=4096,
            intermediate_dim=args.intermediate,
            lora_rank=8,
            lora_alpha=16,
        )
    set_trainable_params(model, get_adapter_params(model))
    return FSDP(
        module=model,
        auto_wrap_policy=utils.lora_fsdp_wrap_policy(
            modules_to_wrap={modules.TransformerDecoderLayer}
        ),
        sharding_strategy=torch.distributed.fsdp.ShardingStrategy.FULL_SHARD,
        device_id=torch.device("cpu"),
        mixed_precision=None,
    )


def block_units(model):
    """The FSDP units that wrap a transformer block (not the root, not an adapter)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torchtune import modules

    return [
        m
        for m in model.modules()
        if isinstance(m, FSDP) and isinstance(m.module, modules.TransformerDecoderLayer)
    ]


def watch_gathered_blocks(units, counts):
    """Records, whenever the gradient reaches a block's output, how many blocks hold their
    gathered (unsharded) parameters."""

    def gathered():
        return sum(u._handle.flat_param._full_param_padded.untyped_storage().size() > 0 for u in units)

    def on_output(module, inputs, output):
        if output.requires_grad:
            output.register_hook(lambda grad: counts.append(gathered()))

    for u in units:
        u.register_forward_hook(on_output)


def micro_batch(args, model, optimizer, loss_fn, idx):
    """The recipe's training step, as written there."""
    input_ids = torch.randint(0, args.vocab, (args.batch, args.seq))
    labels = torch.randint(0, args.vocab, (args.batch, args.seq))
    logits = model(input_ids)
    logits = logits[..., :-1, :].contiguous()
    labels = labels[..., 1:].contiguous()
    logits = logits.transpose(1, 2)
    loss = loss_fn(logits, labels) / args.accum
    loss.backward()
    if (idx + 1) % args.accum == 0:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def peak_allocated(prof):
    """Largest running sum of the CPU allocator's memory events, in time order."""
    events = [
        e
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU
    ]
    events.sort(key=lambda e: e.start_us())
    live = peak = 0
    for e in events:
        live += e.nbytes()
        peak = max(peak, live)
    return peak, live


def main():
    args = parse_args()
    sys.path.insert(0, args.torchtune)
    dist.init_process_group("gloo")
    model = build_model(args)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=3e-4, weight_decay=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    gathered_counts = []
    watch_gathered_blocks(block_units(model), gathered_counts)
    for idx in range(args.accum):
        micro_batch(args, model, optimizer, loss_fn, idx)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for idx in range(args.accum, 2 * args.accum):
            micro_batch(args, model, optimizer, loss_fn, idx)
    if dist.get_rank() == 0:
        persistent = sum(p.numel() * p.element_size() for p in model.parameters())
        persistent += sum(
            t.numel() * t.element_size()
            for state in optimizer.state.values()
            for t in state.values()
            if torch.is_tensor(t)
        )
        peak, end = peak_allocated(prof)
        attention = sorted({e.name for e in prof.events() if "attention" in e.name})
        print(
            json.dumps(
                {
                    "torch": torch.__version__,
                    "layers": args.layers,
                    "hidden": args.hidden,
                    "persistent_bytes": persistent,
                    "step_peak_bytes": peak,
                    "peak_allocated_mib": round((persistent + peak) / 2**20, 1),
                    "bytes_left_after_steps": end,
                    "most_blocks_gathered_in_backward": max(gathered_counts),
                    "attention_ops": attention,
                }
            )
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
