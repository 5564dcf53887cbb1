//! The device placement of the training state (masters, gradients, optimizer states as device
//! tensors: the engine a GPU runs) held to the host placement (today's CPU engine): the same losses
//! over 20 steps for each family, on flex and on burn's portable ndarray backend (which takes every
//! kernel's burn-op fallback, the code path of a GPU), and checkpoints that move between the two;
//! each family's gradients sent block by block as its backward goes (data parallelism's overlap).

mod engine_fixtures;

use engine_fixtures::*;
use memfit_nn::bert::BertModel;
use memfit_nn::decoder::{DecoderModel, DecoderOptions};
#[cfg(feature = "wgpu")]
use memfit_nn::kernels::dropout::SplitMix64;
use memfit_nn::model::TrainModel;
use memfit_nn::t5::T5Model;
#[cfg(feature = "wgpu")]
use memfit_train::engine::Seq2SeqBatch;
use memfit_train::engine::{
    Backend, Engine, GradBucket, ModelEngine, Placement, Precision, Replica,
};
use memfit_train::optim::{AdafactorConfig, OptimizerConfig};

/// The engines every family is checked on: host on flex (today's), device on flex, device on
/// ndarray (the GPU's code path); built with `--features wgpu`, device on burn's wgpu backend too
/// (cubecl's kernels, as on CUDA; here Mesa's software renderer).
fn placements() -> Vec<(Backend, Placement)> {
    let all = vec![
        (Backend::Flex, Placement::Host),
        (Backend::Flex, Placement::Device),
        (Backend::Ndarray, Placement::Device),
    ];
    #[cfg(feature = "wgpu")]
    let all = [all, vec![(Backend::Wgpu, Placement::Device)]].concat();
    all
}

fn t5_losses(
    (backend, placement): (Backend, Placement),
    optimizer: OptimizerConfig,
    freeze: &[&str],
) -> Vec<f32> {
    let mut opts = options(backend, placement, optimizer);
    opts.freeze = freeze.iter().map(|s| s.to_string()).collect();
    let mut engine = ModelEngine::new(T5Model::init(t5_config(), 3), opts).unwrap();
    train(&mut engine, &t5_batches())
}

#[test]
fn t5_device_placement_trains_as_the_host_placement() {
    for (optimizer, freeze) in [
        (adamw(), vec![]),
        (
            OptimizerConfig::Adafactor(AdafactorConfig::default()),
            vec!["embeddings", "encoder"],
        ),
    ] {
        let reference = t5_losses(placements()[0], optimizer.clone(), &freeze);
        for at in &placements()[1..] {
            let got = t5_losses(*at, optimizer.clone(), &freeze);
            let what = format!("t5 {} {at:?} freeze {freeze:?}", optimizer.name());
            assert_same_losses(&what, &reference, &got, 1e-5);
        }
    }
}

#[test]
fn bert_device_placement_trains_as_the_host_placement() {
    let losses = |at: (Backend, Placement)| {
        let model = BertModel::init(bert_config(), 11);
        let mut engine = ModelEngine::new(model, options(at.0, at.1, adamw())).unwrap();
        train(&mut engine, &bert_batches())
    };
    let reference = losses(placements()[0]);
    for at in &placements()[1..] {
        assert_same_losses(&format!("bert {at:?}"), &reference, &losses(*at), 1e-5);
    }
}

#[test]
fn decoder_lora_device_placement_trains_as_the_host_placement() {
    let losses = |(backend, placement): (Backend, Placement)| {
        let model = decoder_model(backend.device()).unwrap();
        let mut engine = ModelEngine::new(model, options(backend, placement, adamw())).unwrap();
        train(&mut engine, &decoder_batches())
    };
    let reference = losses(placements()[0]);
    for at in &placements()[1..] {
        assert_same_losses(
            &format!("decoder lora {at:?}"),
            &reference,
            &losses(*at),
            1e-5,
        );
    }
}

/// Built with `--features wgpu`: with dropout on, the device placement on cubecl's kernels trains
/// as the host placement on the CPU, because memfit's dropout kernel draws the CPU's masks
/// (`kernels/device/dropout.rs`): BERT (embeddings, attention probabilities, residual branches), T5
/// (dropout after ReLU too) and the LoRA decoder (the adapters' dropout, which flex fuses into the
/// adapter's product). The runs with dropout differ from those without: the masks act.
#[cfg(feature = "wgpu")]
#[test]
fn with_dropout_the_gpu_draws_the_cpus_masks() {
    let (host, gpu) = (placements()[0], (Backend::Wgpu, Placement::Device));
    let bert = |at: (Backend, Placement), p: f64| {
        let mut cfg = bert_config();
        (cfg.hidden_dropout_prob, cfg.attention_probs_dropout_prob) = (p, p);
        let model = BertModel::init(cfg, 11);
        let mut engine = ModelEngine::new(model, options(at.0, at.1, adamw())).unwrap();
        train(&mut engine, &bert_batches())
    };
    let reference = bert(host, 0.2);
    assert_ne!(
        reference,
        bert(host, 0.0),
        "bert: dropout changes the losses"
    );
    assert_same_losses("bert, dropout 0.2", &reference, &bert(gpu, 0.2), 1e-5);
    let t5 = |at: (Backend, Placement), p: f64| {
        let mut cfg = t5_config();
        cfg.dropout_rate = p;
        let opts = options(at.0, at.1, adamw());
        let mut engine = ModelEngine::new(T5Model::init(cfg, 3), opts).unwrap();
        train(&mut engine, &t5_batches())
    };
    let reference = t5(host, 0.2);
    assert_ne!(reference, t5(host, 0.0), "t5: dropout changes the losses");
    assert_same_losses("t5, dropout 0.2", &reference, &t5(gpu, 0.2), 1e-5);
    let lora = |(backend, placement): (Backend, Placement), p: f64| {
        let model = decoder_model_with_dropout(backend.device(), p).unwrap();
        let mut engine = ModelEngine::new(model, options(backend, placement, adamw())).unwrap();
        train(&mut engine, &decoder_batches())
    };
    let reference = lora(host, 0.2);
    assert_ne!(
        reference,
        lora(host, 0.0),
        "lora: dropout changes the losses"
    );
    assert_same_losses("lora, dropout 0.2", &reference, &lora(gpu, 0.2), 1e-5);
}

/// A checkpoint written by the device placement resumes in the host placement (and the reverse),
/// continuing as an uninterrupted run: the same files either way.
#[test]
fn checkpoints_move_between_placements() {
    let batches = t5_batches();
    let engine = |at: (Backend, Placement)| {
        ModelEngine::new(T5Model::init(t5_config(), 3), options(at.0, at.1, adamw())).unwrap()
    };
    let mut whole = engine(placements()[0]);
    let uninterrupted = train(&mut whole, &batches);
    for (first, second) in [
        (placements()[2], placements()[0]),
        (placements()[0], placements()[2]),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut a = engine(first);
        let head: Vec<f32> = train_steps(&mut a, &batches, 0..STEPS / 2);
        a.save(dir.path()).unwrap();
        let mut b = engine(second);
        b.load(dir.path(), true).unwrap();
        assert_eq!(b.optimizer_step(), (STEPS / 2) as u64);
        let tail = train_steps(&mut b, &batches, STEPS / 2..STEPS);
        let resumed: Vec<f32> = head.into_iter().chain(tail).collect();
        assert_same_losses(
            &format!("{first:?} then {second:?}"),
            &uninterrupted,
            &resumed,
            1e-5,
        );
    }
}

/// bf16 on the device placement is the host placement's mixed precision (f32 masters, bf16
/// compute), step for step; and it learns.
#[test]
fn bf16_on_the_device_placement_is_the_host_placements_mixed_precision() {
    let losses = |placement| {
        let mut opts = options(Backend::Flex, placement, adamw());
        opts.precision = Precision::Bf16;
        let mut e = ModelEngine::new(T5Model::init(t5_config(), 3), opts).unwrap();
        train(&mut e, &t5_batches())
    };
    let reference = losses(Placement::Host);
    assert_same_losses("t5 bf16", &reference, &losses(Placement::Device), 1e-5);
}

/// Each trained parameter's gradient sent once, in more buckets than blocks: what
/// [`Replica::accumulate_and_send`] hands a data-parallel reduction during the backward.
struct Sent {
    buckets: usize,
    grads: Vec<Option<Vec<f32>>>,
}

/// Two micro-batches (per-block checkpointing on), the second sending its finished gradients:
/// each trained parameter is sent exactly once, and what is sent is what plain accumulation of the
/// same two micro-batches holds.
fn sent_gradients<M: TrainModel + Send>(
    model: impl Fn() -> M,
    at: (Backend, Placement),
    freeze: &[&str],
    batches: &[M::Batch],
) -> Sent {
    let engine = || {
        let mut opts = options(at.0, at.1, adamw());
        opts.grad_ckpt = true;
        opts.freeze = freeze.iter().map(|s| s.to_string()).collect();
        ModelEngine::new(model(), opts).unwrap()
    };
    let mut plain = engine();
    for (i, b) in batches[..2].iter().enumerate() {
        plain.accumulate(b, 0.5, i as u64).unwrap();
    }
    let expected = plain.accumulated_gradients();
    let mut sending = engine();
    sending.accumulate(&batches[0], 0.5, 0).unwrap();
    let mut sent: Vec<Option<Vec<f32>>> = vec![None; expected.len()];
    let mut buckets = 0;
    let mut send = |bucket: GradBucket| {
        buckets += 1;
        for (i, g) in bucket {
            assert!(sent[i].is_none(), "parameter {i} sent twice");
            sent[i] = Some(g.into_data().try_to_vec::<f32>().unwrap());
        }
        Ok(())
    };
    sending
        .accumulate_and_send(&batches[1], (0.5, 1), &mut send)
        .unwrap();
    let trained = sending.trained_sizes();
    for (i, (e, s)) in expected.iter().zip(&sent).enumerate() {
        assert_eq!(s.is_some(), trained[i].is_some(), "parameter {i}");
        if let (Some(e), Some(s)) = (e, s) {
            let worst = (e.iter().zip(s))
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            assert!(worst <= 1e-6, "parameter {i}: sent differs by {worst}");
        }
    }
    Sent {
        buckets,
        grads: sent,
    }
}

#[test]
fn every_family_sends_its_gradients_block_by_block_as_the_backward_goes() {
    for at in [placements()[0], placements()[2]] {
        // head, 2 decoder blocks, decoder bias, encoder norm, 2 encoder blocks, encoder bias, the
        // shared embedding; frozen embeddings and encoder: the decoder side only
        let t5 = || T5Model::init(t5_config(), 3);
        let sent = sent_gradients(t5, at, &[], &t5_batches());
        assert_eq!(sent.buckets, 9, "t5 {at:?}");
        let sent = sent_gradients(t5, at, &["embeddings", "encoder"], &t5_batches());
        assert_eq!(sent.buckets, 4, "t5 frozen encoder {at:?}");
        assert!(sent.grads.iter().any(Option::is_none));
        // head, 2 layers, the embeddings
        let bert = || BertModel::init(bert_config(), 11);
        assert_eq!(sent_gradients(bert, at, &[], &bert_batches()).buckets, 4);
        // LoRA: the adapters of each layer, nothing else trains
        let lora = || decoder_model(at.0.device()).unwrap();
        assert_eq!(sent_gradients(lora, at, &[], &decoder_batches()).buckets, 2);
        // full: head (final norm, untied head), 2 layers, the embedding
        let full = || DecoderModel::init(decoder_config(), &DecoderOptions::full()).unwrap();
        assert_eq!(sent_gradients(full, at, &[], &decoder_batches()).buckets, 4);
    }
}

/// Built with `--features wgpu`: a micro-batch whose attention scores cubecl cannot allocate
/// fails as out of memory (not a panic), and the engine trains on after it as an engine that never
/// saw it (what the loop's halving relies on: cubecl reports the failure late, on a read).
#[cfg(feature = "wgpu")]
#[test]
fn after_a_real_cubecl_out_of_memory_the_engine_trains_on() {
    let at = (Backend::Wgpu, Placement::Device);
    let engine =
        || ModelEngine::new(T5Model::init(t5_config(), 3), options(at.0, at.1, adamw())).unwrap();
    // 64 rows × 4 heads × 1024² f32 scores: 1 GiB, past the software adapter's largest buffer
    let mut rng = SplitMix64::new(1);
    let source = rows(&mut rng, 64, 1024, 40);
    let huge = Seq2SeqBatch {
        labels: source.ids.clone(),
        label_mask: source.mask.clone(),
        tgt_len: source.len,
        source,
    };
    let mut hit = engine();
    let err = hit.accumulate(&huge, 1.0, 0).unwrap_err();
    assert!(ModelEngine::<T5Model>::is_out_of_memory(&err), "{err}");
    hit.discard_gradients();
    let batches = t5_batches();
    let after = train_steps(&mut hit, &batches, 0..5);
    let fresh = train_steps(&mut engine(), &batches, 0..5);
    assert_eq!(after, fresh);
}
