//! Training stacks as profiles (`--stack`): what the code around the model keeps differently.
//! Each switch names the source file it was read from; none is fitted to a measurement.
//!
//! | stack | model code | causal-LM loss | FSDP gradients | QLoRA |
//! | --- | --- | --- | --- | --- |
//! | `hf-trainer` | transformers | whole logits, fp32 upcast | `no_sync` while accumulating | as loaded |
//! | `peft` | transformers | whole logits, fp32 upcast | `no_sync` while accumulating | non-quantized parameters in fp32 |
//! | `torchtune` | torchtune | 8 chunks, each upcast, logits freed | sharded every micro-batch | torchao NF4 saves no input |
//! | `litgpt` | LitGPT (fused qkv) | 128-token chunks, no upcast, kept | `no_sync`, whole blocks | every linear quantized, head too |
//! | `accelerate-deepspeed` | transformers | whole logits, fp32 upcast | (DeepSpeed engine, no FSDP) | as loaded |
//! | `lightning` | transformers | whole logits, fp32 upcast | sharded every micro-batch, whole blocks | as loaded |
//!
//! Only `hf-trainer` and `peft` (transformers' Trainer) drop the model's outputs before backward.

use super::setup::{Method, Setup, Stack, Zero};
use crate::Task;
use crate::arch::params::push_head;
use crate::arch::{Activation, Arch, Head, ParamTensor, Role};
use std::borrow::Cow;

/// How a causal LM's logits and loss are computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loss {
    /// The whole logits tensor, then transformers' `ForCausalLMLoss` (`loss/loss_utils.py`:
    /// `logits.float()`, labels shifted); 2022 models shifted a copy of the logits instead
    /// (`Framework::causal_loss_upcast` tells which).
    Whole,
    /// LitGPT: the head runs over chunks of `tokens` positions and returns the list of chunks
    /// (`GPT.forward(lm_head_chunk_size=128)`, `finetune/lora.py`), which the training step keeps
    /// until backward; `chunked_cross_entropy` (`litgpt/utils.py`) takes each chunk in the
    /// logits' dtype, so each chunk's log-softmax output is saved in that dtype.
    ChunkedKeep { tokens: u64 },
    /// torchtune's `CEWithChunkedOutputLoss` (`torchtune/modules/loss/ce_chunked_output_loss.py`):
    /// the output projection runs in `chunks` pieces (`model.set_num_output_chunks`), each piece is
    /// upcast to fp32 inside the loss, and the recipe deletes its list of logits before backward
    /// (`del logits`, `recipes/lora_finetune_single_device.py`): only the fp32 log-softmax
    /// outputs stay.
    ChunkedUpcast { chunks: u64 },
    /// torchtune before its chunked loss (`recipes/lora_finetune_single_device.py`, April 2024):
    /// the decoder returns fp32 logits (`self.output(h).float()`), the step replaces them with a
    /// shifted copy (`logits[..., :-1, :].contiguous()`), which it keeps, and
    /// `nn.CrossEntropyLoss` saves its fp32 log-softmax output.
    Plain,
}

/// What a stack does, as far as memory is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Profile {
    pub loss: Loss,
    /// LitGPT's model code (`litgpt/model.py`): one fused qkv linear in every architecture, q, k
    /// and v views of its output (`qkv.split`), k and v repeated to every head by `expand` +
    /// `reshape` (a copy) under grouped queries, and a LoRA on part of the fused linear padded
    /// with zeros by `index_copy` (`litgpt/lora.py` `LoRAQKVLinear.zero_pad`), which saves its
    /// source.
    pub litgpt_code: bool,
    /// LoRA dropout is on: its output and mask are saved per adapted linear. PEFT's examples and
    /// LitGPT's configs set 0.05–0.1; torchtune's configs set `lora_dropout: 0.0`
    /// (`recipes/configs/*/*lora*.yaml`), where PEFT-style `nn.Identity` lets the adapter read
    /// the input the base linear already has.
    pub lora_dropout: bool,
    /// FSDP accumulates the micro-batches before the last under `no_sync()`, which keeps each
    /// unit's unsharded gradient until the synchronising one (torch `FullyShardedDataParallel.
    /// no_sync`: "FSDP will accumulate the full model gradients (instead of gradient shards)").
    /// transformers' Trainer (`trainer.py`: `accelerator.no_sync` unless the last micro-batch)
    /// and Lightning Fabric (`fabric.no_backward_sync`, which LitGPT's scripts use) do this;
    /// PyTorch Lightning's Trainer blocks sync only for DDP (`strategies/parallel.py`
    /// `block_backward_sync`), torchtune's recipes never.
    pub fsdp_no_sync: bool,
    /// FSDP wraps each transformer block as one unit with `use_orig_params=True`, so a block's
    /// frozen and trainable tensors share one flat parameter whose gradient spans all of it
    /// (torch `fsdp/_wrap_utils.py` warns: "gradient memory usage will be higher than
    /// expected"). Lightning (Fabric and Trainer, `strategies/fsdp.py`:
    /// `kwargs.setdefault("use_orig_params", True)`) does; accelerate's FSDP defaults to
    /// `use_orig_params=False`, which refuses mixed units, so PEFT wraps its adapters as units
    /// of their own (`peft.utils.other.fsdp_auto_wrap_policy`); torchtune wraps LoRA modules
    /// separately too (`training.shard_model`).
    pub fsdp_mixed_units: bool,
    /// QLoRA: PEFT's `prepare_model_for_kbit_training` (`peft/utils/other.py`) casts every
    /// fp16/bf16 parameter that is not a `Params4bit` to fp32 (embeddings, norms, biases, the
    /// head).
    pub kbit_fp32: bool,
    /// QLoRA: the LM head is quantized too. LitGPT's bitsandbytes plugin replaces every
    /// `nn.Linear` (`lightning/fabric/plugins/precision/bitsandbytes.py` `_convert_layers`);
    /// transformers keeps `lm_head` in 16 bit (`llm_int8_skip_modules`, its default
    /// `get_keys_to_not_convert`).
    pub quantize_head: bool,
    /// QLoRA: the quantized linear saves its input for backward. bitsandbytes' `MatMul4Bit`
    /// did until 0.44 (`ctx.tensors = (A, B)`, removed by "fix QLoRA mem bug", July 2024) —
    /// see `Framework::bnb_saves_input`; torchao's `linear_nf4` (torchtune) never does
    /// (`torchao/dtypes/nf4tensor.py` `_LinearNF4` keeps only the weight).
    pub torchao_nf4: bool,
    /// A DeepSpeed engine trains at every `--zero`, stage 0 included: the module is cast to
    /// 16 bit (no autocast) and the optimizer keeps fp32 master weights
    /// (`deepspeed/runtime/engine.py` `_configure_distributed_model`, `bf16_optimizer.py`).
    pub deepspeed_engine: bool,
    /// The optimizer steps inside backward, one parameter at a time, by default: torchtune's
    /// full single-device configs set `optimizer_in_bwd: True`
    /// (`recipes/configs/llama3_2/3B_full_single_device.yaml`); the recipe refuses it with
    /// gradient accumulation (`recipes/full_finetune_single_device.py`).
    pub optimizer_in_backward: bool,
    /// The training step lets go of the model's outputs (logits included) before backward, so
    /// backward recomputes a checkpointed block only once the loss's tensors are freed:
    /// transformers' Trainer (`trainer.py` `compute_loss` returns only the loss). The other
    /// stacks' loops hold them (LitGPT's `logits` list, `finetune/lora.py`; a user's accelerate
    /// or Lightning loop) or are not read for it (torchtune).
    pub outputs_freed_before_backward: bool,
}

impl Stack {
    /// The model runs as transformers' modeling code (and PEFT's LoRA): not LitGPT's or
    /// torchtune's own modules.
    pub fn runs_transformers_code(self) -> bool {
        !self.profile().litgpt_code && self != Stack::Torchtune
    }

    /// The profile of a stack.
    pub fn profile(self) -> Profile {
        let transformers = Profile {
            loss: Loss::Whole,
            litgpt_code: false,
            lora_dropout: true,
            fsdp_no_sync: true,
            fsdp_mixed_units: false,
            kbit_fp32: false,
            quantize_head: false,
            torchao_nf4: false,
            deepspeed_engine: false,
            optimizer_in_backward: false,
            outputs_freed_before_backward: false,
        };
        let trainer = Profile {
            outputs_freed_before_backward: true,
            ..transformers
        };
        match self {
            Stack::HfTrainer => trainer,
            Stack::Peft => Profile {
                kbit_fp32: true,
                ..trainer
            },
            Stack::Torchtune => Profile {
                // torchtune/modules/loss/ce_chunked_output_loss.py: num_output_chunks = 8
                loss: Loss::ChunkedUpcast { chunks: 8 },
                lora_dropout: false,
                fsdp_no_sync: false,
                torchao_nf4: true,
                optimizer_in_backward: true,
                ..transformers
            },
            Stack::Litgpt => Profile {
                // litgpt/finetune/lora.py: model(input_ids, lm_head_chunk_size=128)
                loss: Loss::ChunkedKeep { tokens: 128 },
                litgpt_code: true,
                fsdp_mixed_units: true,
                quantize_head: true,
                ..transformers
            },
            Stack::AccelerateDeepspeed => Profile {
                deepspeed_engine: true,
                ..transformers
            },
            Stack::Lightning => Profile {
                fsdp_no_sync: false,
                fsdp_mixed_units: true,
                ..transformers
            },
        }
    }
}

/// Setup-dependent resolutions of a profile.
impl Profile {
    /// The step runs inside backward for this setup: the stack's default (or the setup's
    /// override), and only where the stack allows it — full fine-tuning without accumulation.
    pub fn steps_in_backward(&self, setup: &Setup) -> bool {
        let wanted = setup
            .optimizer_in_backward
            .unwrap_or(self.optimizer_in_backward && setup.world() == 1);
        wanted && setup.accum == 1 && setup.method == Method::Full && setup.zero == Zero::Z0
    }

    /// Whether the model runs as a DeepSpeed engine: always for a DeepSpeed stack, and for any
    /// stack under a DeepSpeed ZeRO stage (FSDP is not DeepSpeed).
    pub fn deepspeed(&self, setup: &Setup) -> bool {
        setup.device == super::Device::Cuda
            && (self.deepspeed_engine || (setup.zero.stage() >= 1 && !setup.zero.is_fsdp()))
    }

    /// Whether backward reaches a recomputed block only after the loss's tensors are freed: the
    /// stack's loop drops the outputs (or the setup says so), the allocations being a GPU's.
    pub fn loss_freed_before_recompute(&self, setup: &Setup) -> bool {
        let freed = setup
            .outputs_kept
            .map_or(self.outputs_freed_before_backward, |kept| !kept);
        freed && setup.grad_ckpt && setup.device == super::Device::Cuda
    }

    /// The loss this setup computes: the stack's for a causal LM, where `setup.chunked_loss =
    /// Some(false)` turns torchtune's chunked loss back into its plain one.
    pub fn loss_for(&self, setup: &Setup) -> Loss {
        match (setup.task, self.loss, setup.chunked_loss) {
            (Task::CausalLm, Loss::ChunkedUpcast { .. }, Some(false)) => Loss::Plain,
            (Task::CausalLm, loss, _) => loss,
            _ => Loss::Whole,
        }
    }
}

/// The architecture as the stack's model code builds it. LitGPT (`litgpt/model.py`) builds one
/// fused qkv linear per block (`CausalSelfAttention.attn`, `(n_head + 2 · n_query_groups) ·
/// head_size` outputs) where transformers has separate q, k and v projections (the same
/// elements in one tensor); never ties its head to the embedding (`GPT.lm_head` is a linear of
/// its own beside `transformer.wte`); and computes every GELU with the fused
/// `torch.nn.functional.gelu(approximate=…)`, never transformers' Python `gelu_new`.
pub fn model_view<'a>(arch: &'a Arch, profile: &Profile) -> Cow<'a, Arch> {
    if !profile.litgpt_code || arch.is_encoder_decoder() || arch.decoder_layers == 0 {
        return Cow::Borrowed(arch);
    }
    let separate = |t: &ParamTensor| matches!(t.role, Role::Q | Role::K | Role::V) && t.rows > 1;
    let mut lit = arch.clone();
    lit.tensors.clear();
    for t in &arch.tensors {
        if !separate(t) {
            lit.tensors.push(*t);
            continue;
        }
        match lit.tensors.iter_mut().find(|f| {
            f.role == Role::Qkv && f.group == t.group && f.rows == t.rows && f.count == t.count
        }) {
            Some(f) => f.cols += t.cols,
            None => lit.tensors.push(ParamTensor {
                role: Role::Qkv,
                ..*t
            }),
        }
    }
    if lit.head == Head::LmTied {
        lit.head = Head::LmUntied { bias: false };
        push_head(
            &mut lit.tensors,
            lit.embed_dim,
            lit.vocab,
            lit.head,
            lit.family,
        );
    }
    if lit.activation == Activation::GeluNew {
        lit.activation = Activation::GeluTanh;
    }
    Cow::Owned(lit)
}
