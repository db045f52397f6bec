"""RLT's truncated backpropagation through time (RLTConfig.tbptt, issue 25): a truncation window
covering the sequence gives full BPTT's gradients; a shorter one gives those of a hand-written
per-token loop (the fp64 reference of test_rlt_model.py) that detaches the state and every decoder
layer's window K/V at positions k, 2k, ... (the paper's H.1 complete decoder-state detach); config
errors name the value."""
import pytest
import torch

from rgpt_dist.models.rlt.config import RLTConfig
from tests.models.rlt.test_rlt_model import TINY, Reference, tiny_model, tokens


class TruncatedReference(Reference):
    """The reference's per-token loop with a stop-gradient of h (the register) and of every stored
    decoder K/V at each multiple of k (values unchanged; the encoder memory is not cut)."""

    def __init__(self, cfg, model, k):
        super().__init__(cfg, model, grad=True)
        self.k = k

    def logits(self, xs):
        cfg = self.cfg
        B, L, G = cfg.feedback_interval, cfg.n_dec, cfg.mem_groups
        e = self.encoder(xs)
        mems = [[self.memory(g, e[t], t) for t in range(len(xs))] for g in range(G)]
        h, kv, out = self.P["merge.s0"], [[] for _ in range(L)], []
        for t in range(len(xs)):
            if t and t % self.k == 0:                                           # (H.1)
                h = h.detach()
                kv = [[[tuple(x.detach() for x in head) for head in heads] for heads in layer] for layer in kv]
            z = self.merge(e[t], h)
            for i in range(L):
                z = self.decoder_layer(i, z, t, kv, mems[i * G // L])
            if (t + 1) % B == 0:
                h = z
            out.append((self.rms(z, "head.ln_f.weight") / self.m) @ self.P["embed.wte.weight"].T)
        return torch.stack(out)


def grads(model, x, y):
    model.zero_grad(set_to_none=True)
    model(x, y).loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("feedback_interval,k", [(1, 11), (1, 128), (3, 12)])
def test_a_window_covering_the_sequence_is_full_bptt(feedback_interval, k):
    """k >= T = 11 never truncates: every gradient equals full BPTT's (tbptt = 0) bitwise."""
    _, model = tiny_model(feedback_interval=feedback_interval)
    idx = tokens()
    x, y = idx[:, :-1], idx[:, 1:]
    full = grads(model, x, y)
    model.cfg.tbptt = k
    got = grads(model, x, y)
    assert all(torch.equal(got[n], full[n]) for n in full)


@pytest.mark.parametrize("feedback_interval,k", [(1, 4), (3, 6)])
def test_a_shorter_window_equals_a_hand_written_detach_loop(feedback_interval, k):
    """RLT-1 truncated every 4 positions and RLT-2 (B = 3) every 6 (two chunks): every parameter's
    gradient equals the truncated reference's (<= 1e-12 relative; measured <= 6e-16), and differs
    from full BPTT's (the truncation is seen), the loss unchanged."""
    cfg, model = tiny_model(feedback_interval=feedback_interval)
    idx = tokens()
    x, y = idx[:, :-1], idx[:, 1:]
    full = grads(model, x, y)
    model.cfg.tbptt = k
    loss = model(x, y).loss
    got = grads(model, x, y)
    model.zero_grad(set_to_none=True)
    ref = TruncatedReference(cfg, model, k)
    want = torch.stack([ref.logits(row.tolist()) for row in x])
    ref_loss = torch.nn.functional.cross_entropy(want.flatten(0, 1), y.flatten())
    ref_loss.backward()
    assert abs(loss.item() - ref_loss.item()) <= 1e-12
    worst = 0.0
    for n, p in model.named_parameters():
        scale = max(1.0, p.grad.abs().max().item())
        worst = max(worst, (got[n] - p.grad).abs().max().item() / scale)
    assert worst <= 1e-12, worst
    assert max((got[n] - full[n]).abs().max().item() for n in full) > 1e-2  # measured 3.4e-2, 7.7e-2


def test_tbptt_errors_name_the_value():
    base = {**TINY, "feedback_interval": 3}
    for over, text in [({"tbptt": -1}, "model.tbptt=-1 must be >= 0"),
                       ({"tbptt": 4}, "model.tbptt=4 must be a multiple of model.feedback_interval=3"),
                       ({"tbptt": 8, "feedback_interval": 0},
                        "model.tbptt=8 must be 0 with model.feedback_interval=0")]:
        bad = RLTConfig(**{**base, **over}).problems("model")
        assert any(p.startswith(text) for p in bad), (text, bad)
    assert RLTConfig(**{**base, "tbptt": 6}).problems("model") == []
    assert RLTConfig(**{**TINY, "feedback_interval": 1, "tbptt": 5}).problems("model") == []
