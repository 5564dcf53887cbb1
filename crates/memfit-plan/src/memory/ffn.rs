//! A block's feed-forward: a dense MLP, or a mixture of experts (mixtral, qwen2_moe) whose router
//! sends each token to `top_k` experts, as transformers' `MixtralSparseMoeBlock` /
//! `Qwen2MoeSparseMoeBlock` compute it (gather each expert's tokens, run its MLP, scale by the
//! routing weight, `index_add_` back).

use super::block::Ctx;
use crate::arch::{Activation, Family, Moe, Role};

/// Which feed-forward a block has.
#[derive(Debug, Clone, Copy)]
pub(super) enum Ffn {
    Dense,
    Experts(Moe),
}

/// Saved bytes and largest transient of one block's feed-forward over `t` tokens (the norm in
/// front of it and the residual dropout are the block's).
pub(super) fn saved(cx: &Ctx, t: u64, ffn: Ffn) -> (u64, u64) {
    match ffn {
        Ffn::Dense => {
            let input = cx.linear_inputs(t, up_roles(cx), cx.arch.hidden, cx.normed());
            let (body, transient) = mlp_body(cx, t, cx.arch.ffn);
            (input + body, transient)
        }
        Ffn::Experts(m) => experts(cx, t, m),
    }
}

fn up_roles(cx: &Ctx) -> &'static [Role] {
    if cx.arch.gated_ffn {
        &[Role::Gate, Role::Up]
    } else {
        &[Role::Up]
    }
}

/// The mixture over `t` tokens: router, `t · top_k` routed rows through the experts' MLPs, and
/// qwen2_moe's shared expert.
fn experts(cx: &Ctx, t: u64, m: Moe) -> (u64, u64) {
    let (h, w) = (cx.arch.hidden, cx.w);
    let routed = t * m.top_k;
    // The router (`Linear(hidden, experts)`, role Other) reads the normed tensor; so do the
    // shared expert's gate/up projections: one saved input, or a cast per linear under autocast.
    let readers: &[Role] = if m.shared_ffn > 0 {
        &[Role::Other, Role::Gate, Role::Up]
    } else {
        &[Role::Other]
    };
    let mut saved = cx.linear_inputs(t, readers, h, cx.normed());
    // router probabilities: fp32 softmax output (both models `softmax(…, dtype=float)`), the
    // top-k indices (int64) and weights (fp32)
    saved += t * m.experts * 4 + routed * (8 + 4);
    if m.router_aux_loss {
        // the router logits the model returns (compute dtype) and the load-balancing loss's
        // softmax over them, saved for its backward (modeling_mixtral.py load_balancing_loss_func)
        saved += 2 * t * m.experts * w.c;
    }
    // every routed row is a gathered copy (`hidden_states[token_idx]`) feeding its expert's
    // gate/up, then the expert's MLP over it
    saved += cx.linear_inputs(routed, up_roles(cx), h, cx.normed());
    let (body, _) = mlp_body(cx, routed, m.expert_ffn);
    // `expert_output * routing_weight` saves the expert output (and the weight, counted above)
    saved += body + routed * h * w.c;
    // experts run one after another, each over at most `t` rows: one expert's temporaries
    let (_, mut transient) = mlp_body(cx, t, m.expert_ffn);
    if m.shared_ffn > 0 {
        let (shared, shared_transient) = mlp_body(cx, t, m.shared_ffn);
        // sigmoid(shared_expert_gate(x)) · shared_output saves both factors
        saved += shared + t * h * w.c + t * w.c;
        transient = transient.max(shared_transient);
    }
    (saved, transient)
}

/// An MLP of intermediate size `f` over `t` tokens, from the up-projection's output to the
/// down-projection's input (the up-projections' input is the caller's).
fn mlp_body(cx: &Ctx, t: u64, f: u64) -> (u64, u64) {
    let (arch, w) = (cx.arch, cx.w);
    let tf = t * f;
    let act_saved = match arch.activation {
        Activation::Relu => w.c,                                           // output
        Activation::Gelu | Activation::GeluTanh | Activation::Silu => w.c, // input
        // NewGELU: x, tanh(...) (fp32 under autocast: pow is fp32-listed), 1 + tanh, 0.5·x
        Activation::GeluNew => 2 * w.c + 2 * w.f.max(w.c),
    };
    let mut saved = tf * act_saved;
    if arch.gated_ffn {
        // act(gate) · up saves both factors
        saved += tf * 2 * w.c;
    }
    // T5 applies dropout between the activation and wo.
    let inner_drop = arch.family == Family::T5 && arch.hidden_dropout > 0.0;
    if inner_drop {
        saved += tf; // mask
    }
    // The down-projection's input is a tensor of its own unless it is ReLU's saved output: the
    // dropout output, the gated product act(gate) · up, or a GELU/SiLU output.
    let down_input_is_new = inner_drop || arch.gated_ffn || arch.activation != Activation::Relu;
    if cx.trains(Role::Down) && down_input_is_new {
        saved += tf * w.c;
    }
    if cx.lora(Role::Down) {
        saved += tf * (w.c + 1);
    }
    // Backward of the MLP creates gradients of the two largest intermediates (fp32 under amp for
    // the activation's own backward).
    let transient = 2 * tf * w.f.max(w.c);
    (saved, transient)
}
