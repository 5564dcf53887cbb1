//! Host (CPU RAM) peak of one node: runtime, model loading, offloaded states, data, workers.

use super::activations::activations;
use super::framework::{self, Framework, MIB};
use super::gpu::optimizer_step_transient;
use super::setup::{DatasetMode, Device, Method, Runtime, Setup};
use super::states::{StateBytes, model_states};
use super::{Component, HostEstimate, Scaling};
use crate::Task;
use crate::arch::Arch;

/// glibc malloc serves requests above its mmap threshold with mmap (returned to the OS on free);
/// the threshold rises dynamically to the size of freed mmapped chunks, up to 32 MiB on 64-bit
/// (mallopt(3), M_MMAP_THRESHOLD / DEFAULT_MMAP_THRESHOLD_MAX).
const GLIBC_MMAP_THRESHOLD_MAX: u64 = 32 * MIB;

/// transformers `save_pretrained(max_shard_size="5GB")`: the largest checkpoint shard.
const CHECKPOINT_SHARD_BYTES: u64 = 5_000_000_000;

/// Components of the training-phase peak, summed as they are listed.
struct Ledger {
    components: Vec<Component>,
    train: u64,
}

impl Ledger {
    fn add(&mut self, name: &str, bytes: u64, scales: Scaling, note: impl Into<String>) {
        self.train += bytes;
        self.components
            .push(Component::new(name, bytes, scales, note));
    }
}

/// Bytes of the host copy of the weights memfit's trainer keeps per replica when it computes on
/// a GPU: f32, refreshed when a checkpoint is written; a LoRA base is built on the device and has
/// none (the adapters only).
pub fn memfit_host_weights(arch: &Arch, setup: &Setup) -> u64 {
    let params = match setup.method {
        Method::Lora | Method::Qlora => super::states::trainable(arch, setup).adapters,
        _ => arch.params_total(),
    };
    4 * params
}

pub fn host(arch: &Arch, setup: &Setup, fw: &Framework) -> HostEstimate {
    if (setup.runtime, setup.device) == (Runtime::Memfit, Device::Cpu) {
        // memfit's own trainer: its host model is measured (validation/memfit_grid.csv)
        return super::memfit_host::host(arch, setup);
    }
    let ranks = setup.gpus.max(1);
    let st = model_states(arch, setup, fw);
    let wb = setup.precision.weight_bytes();
    let runtime = match (setup.runtime, setup.device) {
        (Runtime::Pytorch, Device::Cuda) => framework::PYTORCH_CUDA_RUNTIME_RSS,
        (Runtime::Pytorch, Device::Cpu) => framework::PYTORCH_CPU_RUNTIME_RSS,
        (Runtime::Memfit, _) => super::memfit_host::FITTED.runtime_rss,
    };
    let mut l = Ledger {
        components: Vec::new(),
        train: 0,
    };
    let neither = Scaling::Neither;
    l.add(
        "runtime",
        runtime * ranks,
        neither,
        format!("{} process baseline × {ranks} rank(s)", setup.runtime),
    );
    if setup.device == Device::Cpu {
        add_cpu_training(&mut l, arch, setup, fw, &st);
    } else if setup.runtime == Runtime::Memfit {
        l.add(
            "host weights",
            memfit_host_weights(arch, setup) * ranks,
            neither,
            "memfit's f32 host copy of the weights (the adapters under LoRA), per rank",
        );
    }
    let offloaded = (st.host_weights + st.host_grads + st.host_optimizer) * ranks;
    l.add(
        "offloaded states",
        offloaded,
        neither,
        "ZeRO offload: parameter / gradient / optimizer partitions in host memory",
    );
    if setup.runtime == Runtime::Pytorch && setup.zero.stage() == 3 && setup.offload_params {
        l.add(
            "load residue (heap)",
            load_residue(arch, wb),
            neither,
            "state-dict tensors ≤ 32 MiB kept by glibc's heap after loading (zero.Init)",
        );
    }
    add_data_loading(&mut l, setup, ranks);
    let train = l.train;
    let mut c = l.components;
    // Checkpoint staging: tensors are copied to host one at a time while serialising.
    let largest = arch.tensors.iter().map(|t| t.size()).max().unwrap_or(0) * wb;
    c.push(Component::new(
        "checkpoint staging",
        largest * ranks,
        neither,
        "largest tensor copied to host while a checkpoint is written",
    ));
    let load = runtime * ranks + model_load(arch, setup, offloaded, largest);
    c.push(Component::new(
        "model load (transient)",
        load - runtime * ranks,
        neither,
        "checkpoint shard (or partition) in RAM while loading, before training",
    ));
    c.retain(|x| x.bytes > 0 || x.name == "dataset");
    HostEstimate {
        eval_rss_bytes: 0,
        peak_rss_bytes: (train + largest * ranks).max(load),
        train_rss_bytes: train,
        components: c,
    }
}

/// --device cpu: the model states and the larger of the activations and the step's temporaries.
fn add_cpu_training(l: &mut Ledger, arch: &Arch, setup: &Setup, fw: &Framework, st: &StateBytes) {
    let act = activations(arch, setup, fw);
    let states = st.gpu_weights + st.gpu_grads + st.gpu_optimizer + st.gpu_paged;
    let step = optimizer_step_transient(arch, setup, fw);
    l.add(
        "model states",
        states,
        Scaling::Neither,
        "weights + gradients + optimizer states in RAM (--device cpu)",
    );
    // the step's temporaries appear after the activations are freed: count the larger
    let (name, bytes, scales, note) = if act.total() >= step {
        (
            "activations",
            act.total(),
            Scaling::BatchAndSequence,
            "saved tensors, logits and temporaries in RAM (--device cpu)",
        )
    } else {
        (
            "optimizer step temporaries",
            step,
            Scaling::Neither,
            "copies made by the optimizer step (more than the activations)",
        )
    };
    l.add(name, bytes, scales, note);
}

/// zero.Init frees full-size parameters after partitioning them, which raises glibc's mmap
/// threshold to its 32 MiB maximum; the state-dict tensors loaded afterwards that fit under it
/// come from the heap and stay resident after the state dict is dropped.
fn load_residue(arch: &Arch, wb: u64) -> u64 {
    arch.tensors
        .iter()
        .filter(|t| t.size() * wb <= GLIBC_MMAP_THRESHOLD_MAX)
        .map(|t| t.elements() * wb)
        .sum()
}

/// The dataset, the loader workers and their pinned batches, on all ranks.
fn add_data_loading(l: &mut Ledger, setup: &Setup, ranks: u64) {
    let tgt = if setup.task == Task::Seq2seq {
        setup.tgt_seq
    } else {
        0
    };
    let tokens_per_row = setup.seq + tgt;
    let (dataset, note) = match setup.dataset {
        // token ids as int32 arrays (Arrow / numpy) for every row, per rank
        DatasetMode::InMemory => (
            setup.dataset_rows * tokens_per_row * 4 * ranks,
            "whole tokenized table in memory",
        ),
        // memory-mapped: pages belong to the page cache and are dropped under pressure
        DatasetMode::TokenStore => (0, "memory-mapped token store (page cache, not RSS)"),
        DatasetMode::Reread => (tokens_per_row * 4 * ranks, "re-read per row"),
    };
    l.add("dataset", dataset, Scaling::Sequence, note);
    // A batch: ids + attention mask + labels as int64.
    let batch_bytes = 3 * 8 * setup.batch * tokens_per_row;
    let per_worker = match setup.runtime {
        Runtime::Pytorch => framework::PYTORCH_WORKER_RSS,
        Runtime::Memfit => framework::MEMFIT_WORKER_RSS,
    };
    let workers = setup.workers * ranks * (per_worker + framework::PREFETCH_FACTOR * batch_bytes);
    let note = format!(
        "{} worker(s) × (process/thread + {} prefetched batches)",
        setup.workers,
        framework::PREFETCH_FACTOR
    );
    l.add("loader workers", workers, Scaling::Batch, note);
    if setup.pin_memory && setup.device == Device::Cuda {
        // the host caching allocator rounds pinned blocks up to a power of two
        let in_flight =
            setup.workers.max(1) * framework::PREFETCH_FACTOR * batch_bytes.next_power_of_two();
        l.add(
            "pinned batches",
            in_flight * ranks,
            Scaling::Batch,
            "page-locked copies of batches in flight (power-of-two blocks)",
        );
    }
}

/// Host bytes while the model loads, above the runtime, on all ranks. transformers loads a
/// checkpoint shard by shard (low_cpu_mem_usage / device_map, the path for sharded and quantized
/// models; `save_pretrained` writes shards of at most 5 GB): one shard is in RAM while its tensors
/// move to the device. With ZeRO-3 (zero.Init) each rank builds only its partition. memfit
/// memory-maps safetensors and converts tensor by tensor.
fn model_load(arch: &Arch, setup: &Setup, offloaded: u64, largest: u64) -> u64 {
    let ranks = setup.gpus.max(1);
    let model = arch.params_total() * setup.precision.weight_bytes();
    let shard = model.min(CHECKPOINT_SHARD_BYTES);
    match (setup.runtime, setup.device) {
        (Runtime::Pytorch, Device::Cuda) if setup.zero.stage() == 3 => offloaded + largest * ranks,
        (Runtime::Pytorch, Device::Cuda) => shard * ranks,
        // on the CPU the loaded model is the training model: + the shard being read
        (Runtime::Pytorch, Device::Cpu) => (model + shard) * ranks,
        (Runtime::Memfit, Device::Cuda) => largest * ranks,
        (Runtime::Memfit, Device::Cpu) => (model + largest) * ranks,
    }
}
