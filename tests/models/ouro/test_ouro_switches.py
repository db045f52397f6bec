"""Ouro's switches (issue #29) against an fp64 re-implementation written here from the equations
(the blocks are tests/models/reference.py's; nothing from rgpt_dist.models.ouro):
- loop_norm: s^(t) = N(core(s^(t-1))), the per-loop norm of Ouro's released modelling code;
- gate_input: the exit gate reads the coda's output c_t (ours) or the state s^(t) (Ouro's), with no
  norm of its own when the state is loop-normed;
- stage=gate: Ouro's stage II (Zhu et al. 2025 section 3.4), only the gate trains, on the BCE
  between 1 - lambda_t and w_t = sigmoid(k (max(0, CE_{t-1} - CE_t) - gamma)), t = 2..R;
and the defaults leave the model as it was (same parameters, same names)."""
from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from rgpt_dist.config import ConfigError, load_config
from rgpt_dist.config.train import TrainConfig
from rgpt_dist.flops import train_flops
from rgpt_dist.models.ouro.config import OuroConfig
from rgpt_dist.models.ouro.model import OuroGPT
from rgpt_dist.models.spec import block_flops, spec_for
from rgpt_dist.train.optim import make_optimizer
from tests.models.reference import block, layer_norm, prelude

CFG = dict(vocab_size=300, block_size=64, d_model=48, n_head=4, n_pre=1, n_rec=2, n_coda=1, n_loops=3,
           entropy_beta=0.3)
GATE = "exits.gate."


def make(seed=0, **overrides):
    torch.manual_seed(seed)
    cfg = OuroConfig(**{**CFG, **overrides})
    model = OuroGPT(cfg).double()
    with torch.no_grad():  # off the init: non-trivial norms, biases and gates spread over (0, 1)
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
        model.exits.gate.proj.weight.mul_(20)
    return model, cfg


def batch(cfg, B=2, T=20, seed=1):
    idx = torch.randint(0, cfg.vocab_size, (B, T + 1), generator=torch.Generator().manual_seed(seed))
    return idx[:, :-1], idx[:, 1:]


def readouts(sd, cfg, idx, targets, r):
    """Per iteration t = 1..r: the token loss CE_t (B, T) and the gate's logit z_t (B, T), written out."""
    eps, losses, logits = cfg.ln_eps, [], []
    s = prelude(sd, cfg, idx)
    for _ in range(r):
        for i in range(cfg.n_rec):
            s = block(s, sd, f"recurrence.blocks.{i}.", cfg.n_head, eps)
        if cfg.loop_norm:  # Ouro: the state is re-normalised after every loop and fed back normed
            s = layer_norm(s, sd["recurrence.loop_norm.weight"], sd["recurrence.loop_norm.bias"], eps)
        c = s
        for i in range(cfg.n_coda):
            c = block(c, sd, f"coda.{i}.", cfg.n_head, eps)
        z = layer_norm(c, sd["head.ln_f.weight"], sd["head.ln_f.bias"], eps) @ sd["embed.wte.weight"][:cfg.vocab_size].T
        logp = z - torch.logsumexp(z, dim=-1, keepdim=True)
        losses.append(-logp.gather(-1, targets[..., None]).squeeze(-1))
        x = s if cfg.gate_input == "state" else c
        if not (cfg.gate_input == "state" and cfg.loop_norm):  # Ouro's gate on the normed state: no norm
            x = layer_norm(x, sd[GATE + "ln.weight"], sd[GATE + "ln.bias"], eps)
        logits.append(x @ sd[GATE + "proj.weight"][0] + sd[GATE + "proj.bias"][0])
    return losses, logits


def joint_objective(losses, logits, beta):
    """J = mean of sum_t p(t) CE_t + beta sum_t p(t) log p(t); p(t) = lambda_t prod_{j<t} (1 - lambda_j), p(r) the rest."""
    lam = [torch.sigmoid(z) for z in logits]
    stay, per_token = torch.ones_like(lam[0]), 0
    for t in range(len(lam)):
        p = stay * lam[t] if t < len(lam) - 1 else stay
        per_token = per_token + p * losses[t] + beta * p * torch.log(p)
        stay = stay * (1 - lam[t])
    return per_token.mean()


def gate_objective(losses, logits, k, gamma):
    """Ouro's stage II (Zhu et al. 2025, Eq. 6 and its sum over steps): (1 / T_max) sum over t = 2..T_max
    of the token mean of -[w log(1 - lambda) + (1 - w) log lambda]."""
    terms = []
    for t in range(1, len(losses)):
        gain = torch.clamp(losses[t - 1].detach() - losses[t].detach(), min=0)
        w = 1 / (1 + torch.exp(-k * (gain - gamma)))
        lam = 1 / (1 + torch.exp(-logits[t]))
        terms.append(-(w * torch.log(1 - lam) + (1 - w) * torch.log(lam)).mean())
    return sum(terms) / len(losses)


@pytest.mark.parametrize("loop_norm,gate_input", [(False, "state"), (True, "coda"), (True, "state")])
def test_loop_norm_and_gate_input_match_reference(loop_norm, gate_input):
    """Training objective and every gradient; the fixed-depth evaluation (the skeleton's loop runs
    the norm too) and the per-token exit read the same equations."""
    model, cfg = make(loop_norm=loop_norm, gate_input=gate_input)
    idx, tgt = batch(cfg)
    out = model.train()(idx, tgt)
    sd = {k: v.detach().clone().requires_grad_(True) for k, v in model.named_parameters()}
    losses, logits = readouts(sd, cfg, idx, tgt, cfg.n_loops)
    ref = joint_objective(losses, logits, cfg.entropy_beta)
    objective = out.loss + out.aux["aux_loss"]
    assert abs(objective.item() - ref.item()) < 1e-12 and abs(out.loss.item() - losses[-1].mean().item()) < 1e-12
    objective.backward()
    ref.backward()
    for name, p in model.named_parameters():
        assert (p.grad - sd[name].grad).abs().max() < 1e-12, name
    assert ("recurrence.loop_norm.weight" in sd) == loop_norm
    assert (GATE + "ln.weight" in sd) == (not (loop_norm and gate_input == "state"))
    model.eval()
    with torch.no_grad():
        assert abs(model(idx, tgt, r=2).loss.item() - readouts(sd, cfg, idx, tgt, 2)[0][-1].mean().item()) < 1e-12
        depth, _ = model.exit_at_threshold(idx, tgt, 0.5)
    lam = [torch.sigmoid(z.detach()) for z in logits[:-1]]
    cdf, stay, want = torch.zeros_like(lam[0]), torch.ones_like(lam[0]), torch.full_like(depth, cfg.n_loops)
    for t, lt in enumerate(lam):  # the first t whose cumulative exit probability reaches q = 0.5
        cdf = cdf + stay * lt
        stay = stay * (1 - lt)
        want = torch.where((cdf >= 0.5) & (want == cfg.n_loops), torch.full_like(want, t + 1), want)
    assert torch.equal(depth, want)


def test_defaults_keep_the_model_as_before():
    """The defaults are today's model: no loop norm, the gate on the coda's output with its own
    norm, the joint objective; the same parameter names and the old count (gate: norm + d + 1)."""
    cfg = OuroConfig(**CFG)
    assert (cfg.loop_norm, cfg.gate_input, cfg.stage) == (False, "coda", "joint")
    model = OuroGPT(cfg)
    names = {n for n, _ in model.named_parameters()}
    assert not any("loop_norm" in n for n in names) and {GATE + "ln.weight", GATE + "ln.bias"} <= names
    assert all(p.requires_grad for p in model.parameters())
    d = cfg.d_model
    assert spec_for(cfg).extra_params(cfg) == 2 * d + d + 1 and spec_for(cfg).step_params(cfg) == 0
    assert load_config("ouro-small-isoflops").model.stage == "joint"


@pytest.mark.parametrize("loop_norm,gate_input,r", [(False, "coda", 3), (True, "state", 4)])
def test_gate_stage_objective_and_gradients_match_reference(loop_norm, gate_input, r):
    """stage=gate: loss + aux_loss is the stage-II loss; only the gate's parameters require (and
    get) gradients, equal to the reference's; the logged loss is still CE_r."""
    model, cfg = make(stage="gate", loop_norm=loop_norm, gate_input=gate_input, gate_k=20.0, gate_gamma=0.01)
    idx, tgt = batch(cfg)
    out = model.train()(idx, tgt, r=r)
    sd = {k: v.detach().clone().requires_grad_(k.startswith(GATE)) for k, v in model.named_parameters()}
    losses, logits = readouts(sd, cfg, idx, tgt, r)
    ref = gate_objective(losses, logits, cfg.gate_k, cfg.gate_gamma)
    objective = out.loss + out.aux["aux_loss"]
    assert abs(objective.item() - ref.item()) < 1e-12 and abs(out.loss.item() - losses[-1].mean().item()) < 1e-12
    objective.backward()
    ref.backward()
    for name, p in model.named_parameters():
        assert p.requires_grad == name.startswith(GATE), name
        if name.startswith(GATE):
            assert (p.grad - sd[name].grad).abs().max() < 1e-12, name
        else:
            assert p.grad is None, name
    gains = torch.stack([(losses[t - 1] - losses[t]).detach() for t in range(1, r)])
    assert (gains > cfg.gate_gamma).any() and (gains <= cfg.gate_gamma).any()  # both targets occur


def test_gate_stage_starts_from_joint_weights_and_steps_only_the_gate():
    """A joint model's state dict loads into a stage=gate model unchanged (strict); the project's
    optimizer then holds the gate's parameters alone, and a step moves nothing else."""
    joint, cfg = make()
    gate = OuroGPT(OuroConfig(**{**CFG, "stage": "gate"})).double()
    gate.load_state_dict(joint.state_dict(), strict=True)
    before = {k: v.clone() for k, v in gate.state_dict().items()}
    opt = make_optimizer(gate, TrainConfig(lr=1e-2, weight_decay=0.1))
    held = {id(p) for group in opt.param_groups for p in group["params"]}
    assert held == {id(p) for n, p in gate.named_parameters() if n.startswith(GATE)}
    idx, tgt = batch(cfg)
    out = gate.train()(idx, tgt)
    (out.loss + out.aux["aux_loss"]).backward()
    opt.step()
    for name, value in gate.state_dict().items():
        assert torch.equal(value, before[name]) != name.startswith(GATE), name


def test_switches_are_validated_and_the_exit_flops_follow_the_gate_input():
    with pytest.raises(ConfigError, match=r"model.n_loops=1 with model.stage='gate': the gate stage needs n_loops >= 2"):
        load_config("ouro-debug", ["model.stage=gate", "model.n_loops=1"])
    with pytest.raises(ConfigError, match=r"model.stage='both' is not one of"):
        load_config("ouro-debug", ["model.stage=both"])
    with pytest.raises(ConfigError, match=r"model.gate_input='normed' is not one of"):
        load_config("ouro-debug", ["model.gate_input=normed"])
    with pytest.raises(ConfigError, match=r"model.gate_k=0.0 must be > 0"):
        load_config("ouro-debug", ["model.gate_k=0"])
    with pytest.raises(ConfigError, match=r"model.gate_gamma=-0.1 must be >= 0"):
        load_config("ouro-debug", ["model.gate_gamma=-0.1"])
    coda = load_config("ouro-small-isoflops").model
    state = load_config("ouro-small-isoflops", ["model.gate_input=state", "model.loop_norm=true"]).model
    spec = spec_for(coda)
    for depth in (1, 4, 10):  # reading the state, a token runs the coda once, at its exit
        saved = spec.exit_flops(coda, 1024, depth) - spec.exit_flops(state, 1024, depth)
        assert saved == pytest.approx((depth - 1) * coda.n_coda * block_flops(coda, 1024), rel=1e-12)


def test_gate_stage_training_flops_are_about_one_forward():
    """torch's flop counter over a gate-stage forward and backward: the forward (every readout)
    plus the gates' weight gradients only, which train_flops counts (no 3 x forward)."""
    over = ["model.vocab_size=512", "model.block_size=64", "model.pad_vocab_multiple=64", "model.n_loops=3",
            "train.seq_len=64"]
    cfg = load_config("ouro-debug", [*over, "model.stage=gate"]).model
    model = OuroGPT(cfg).train()
    idx = torch.randint(0, cfg.vocab_size, (2, 49), generator=torch.Generator().manual_seed(0))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        out = model(idx[:, :-1], idx[:, 1:])
        (out.loss + out.aux["aux_loss"]).backward()
    assert counter.get_total_flops() == pytest.approx(96 * train_flops(cfg, 48), rel=0.005)  # measured 4e-4
    joint = load_config("ouro-debug", over).model
    assert train_flops(cfg, 48) == pytest.approx(train_flops(joint, 48) / 3, rel=0.01)  # measured 0.3335
