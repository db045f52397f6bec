"""The layerwise Recurrent Transformer's attention scan (rgpt_dist/models/rt/tiled.py, issue 27, SPEC
section 9), independent of the family's model: the tiled `scan` against the `naive_scan` oracle in
outputs and gradients (fp64), both against a reference written here from the definition (a loop with an
explicit softmax over the persistent keys < t and the temporary pair), the visits of every (query,
key) pair, the key reads against the closed form (N/2) log2 N, accumulation dtypes and input errors.

The `step` of these tests is a small random nonlinear map mixing the heads, a_t -> (k_t, v_t), with a
per-position term, so that the recurrence matters: a wrong order or a stale key changes every later
pair."""
import math

import pytest
import torch

from rgpt_dist.models.rt.tiled import lowbit, naive_scan, scan

F64 = torch.float64
B, H, HD = 2, 2, 4
SCALE = 0.7
SLOPES = (0.5, 0.125)  # ALiBi slopes per head, strong enough that a wrong distance shows


class Step(torch.nn.Module):
    """(t, a_t (B, H, hd)) -> (k_t, v_t), each (B, H, hd): tanh of a head-mixing map plus a
    position term; records every a_t it is given (the caller's layer output depends on them)."""

    def __init__(self, dtype=F64, seed=1):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.w = torch.nn.Parameter(torch.randn(H * HD, 2 * H * HD, generator=g, dtype=dtype) * 0.6)
        self.b = torch.nn.Parameter(torch.randn(2 * H * HD, generator=g, dtype=dtype) * 0.3)
        self.seen: list[torch.Tensor] = []

    def forward(self, t, a):
        self.seen.append(a)
        h = torch.tanh(a.reshape(a.shape[0], -1) @ self.w + self.b * math.cos(t))   # (B, 2 H hd)
        k, v = h.chunk(2, dim=-1)
        return k.reshape(a.shape), 1.5 * v.reshape(a.shape)


def inputs(N, dtype=F64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, N, HD, generator=g, dtype=dtype).requires_grad_() for _ in range(3)]


def slopes(alibi, dtype=F64):
    return torch.tensor(SLOPES, dtype=dtype) if alibi else None


def reference(q, k_tmp, v_tmp, step, scale, alibi):
    """The definition, one (b, h) row at a time: a_t = sum_j exp(s_tj) v_j / sum_j exp(s_tj) over the
    persistent keys j < t and the temporary pair of t, s_tj = scale q_t . k_j - slope_h (t - j)."""
    N = q.shape[2]
    ks, vs = [], []
    for t in range(N):
        a = torch.zeros(B, H, HD, dtype=q.dtype)
        for b in range(B):
            for h in range(H):
                keys = [k[b, h] for k in ks] + [k_tmp[b, h, t]]
                vals = [v[b, h] for v in vs] + [v_tmp[b, h, t]]
                slope = SLOPES[h] if alibi else 0.0
                s = [scale * float((q[b, h, t] * kj).sum()) - slope * (t - j) for j, kj in enumerate(keys)]
                e = [math.exp(x - max(s)) for x in s]
                a[b, h] = sum(ej * vj for ej, vj in zip(e, vals)) / sum(e)
        k, v = step(t, a)
        ks.append(k)
        vs.append(v)
    return torch.stack(ks, 2), torch.stack(vs, 2)


def run(fn, N, alibi):
    """fn's (k, v), the a_t it produced and the gradients of a loss over all three w.r.t. q, k_tmp,
    v_tmp and the step's parameters."""
    q, k_tmp, v_tmp = inputs(N)
    step = Step()
    k, v = fn(q, k_tmp, v_tmp, step, scale=SCALE, slopes=slopes(alibi))
    a = torch.stack(step.seen, 2)                                      # (B, H, N, hd)
    g = torch.Generator().manual_seed(7)
    loss = sum((x * torch.randn(x.shape, generator=g, dtype=F64)).sum() for x in (k, v, a))
    grads = torch.autograd.grad(loss, [q, k_tmp, v_tmp, step.w, step.b])
    return (k, v, a), grads


@pytest.mark.parametrize("alibi", [False, True])
@pytest.mark.parametrize("N", [1, 2, 3, 7, 8, 33, 64])
def test_scan_equals_naive_in_outputs_and_gradients(N, alibi):
    out, grads = run(scan, N, alibi)
    out_ref, grads_ref = run(naive_scan, N, alibi)
    for x, y in zip(out + grads, out_ref + grads_ref):
        assert (x - y).abs().max().item() <= 1e-12 * max(1.0, y.abs().max().item())   # measured <= 5e-15
    if N > 1:
        assert grads[0].abs().max() > 0.01 and grads[3].abs().max() > 0.01   # the gradients are not trivially 0


@pytest.mark.parametrize("N,alibi", [(1, False), (7, True), (12, False), (17, True)])
def test_both_scans_equal_the_definition(N, alibi):
    q, k_tmp, v_tmp = (x.detach() for x in inputs(N))
    with torch.no_grad():
        ref = reference(q, k_tmp, v_tmp, Step(), SCALE, alibi)
        for fn in (scan, naive_scan):
            got = fn(q, k_tmp, v_tmp, Step(), scale=SCALE, slopes=slopes(alibi))
            for x, y in zip(got, ref):
                assert (x - y).abs().max().item() < 1e-13                       # measured <= 1e-15


def test_alibi_and_the_recurrence_matter():
    """The reference above is sensitive to what it checks: ALiBi and the persistent pairs change a_t."""
    q, k_tmp, v_tmp = (x.detach() for x in inputs(9))
    with torch.no_grad():
        plain, alibi = (scan(q, k_tmp, v_tmp, Step(), scale=SCALE, slopes=slopes(x))[0] for x in (False, True))
        other_step = scan(q, k_tmp, v_tmp, Step(seed=2), scale=SCALE)[0]
    assert (plain - alibi).abs().max() > 0.01 and (plain - other_step).abs().max() > 0.01


def visits(fn, N, counter=None):
    counter = {} if counter is None else counter
    x = torch.randn(1, 1, N, 1)
    with torch.no_grad():
        fn(x, x, x, lambda t, a: (a, a), scale=1.0, counter=counter)
    return counter


@pytest.mark.parametrize("N", [1, 2, 5, 16, 33, 100])
def test_every_pair_visited_once(N):
    """Query i sees each persistent key j < i exactly once and its temporary pair (i, i) once; nothing
    above the diagonal. The counter adds: a second run doubles it."""
    want = torch.tensor([[int(j <= i) for j in range(N)] for i in range(N)])
    for fn in (scan, naive_scan):
        counter = visits(fn, N)
        assert torch.equal(counter["pairs"], want), fn.__name__
        assert torch.equal(visits(fn, N, counter)["pairs"], 2 * want)


def lowest_power_of_two_dividing(t):
    p = 1
    while t % (2 * p) == 0:
        p *= 2
    return p


@pytest.mark.parametrize("N", [1024, 1000])
def test_key_reads_closed_form(N):
    """The folds read sum_{t=1}^{N-1} lowbit(t) keys: (N/2) log2 N = 5120 at N = 1024; the naive scan
    reads t at step t, N (N - 1) / 2 in all."""
    want = sum(lowest_power_of_two_dividing(t) for t in range(1, N))
    assert visits(scan, N)["key_reads"] == want
    if N == 1024:
        assert want == 5120 == N // 2 * int(math.log2(N))
        assert visits(naive_scan, N)["key_reads"] == N * (N - 1) // 2


def test_lowbit():
    assert [lowbit(t) for t in range(1, 13)] == [lowest_power_of_two_dividing(t) for t in range(1, 13)]
    assert lowbit(1024) == 1024 and lowbit(768) == 256
    for bad in (0, -4, 2.0):
        with pytest.raises(ValueError, match=f"t={bad!r} must be an integer >= 1"):
            lowbit(bad)


def attention_given_pairs(q, k_tmp, v_tmp, k, v, alibi):
    """a_t from the definition in fp64, given the persistent pairs (k, v) a scan produced: isolates
    one step's attention from the recurrence (whose rounding low precision amplifies)."""
    out = []
    for t in range(q.shape[2]):
        kk = torch.cat([k[:, :, :t], k_tmp[:, :, t:t + 1]], 2)               # (B, H, t + 1, hd)
        vv = torch.cat([v[:, :, :t], v_tmp[:, :, t:t + 1]], 2)
        s = SCALE * (q[:, :, t:t + 1] @ kk.transpose(-1, -2))                # (B, H, 1, t + 1)
        if alibi:
            s = s - torch.tensor(SLOPES, dtype=F64)[:, None, None] * torch.arange(t, -1, -1, dtype=F64)
        out.append((torch.exp(s) / torch.exp(s).sum(-1, keepdim=True) @ vv).squeeze(2))
    return torch.stack(out, 2)


@pytest.mark.parametrize("fn", [scan, naive_scan])
@pytest.mark.parametrize("dtype,rel,tol", [(torch.float32, 0.0, 1e-6), (torch.bfloat16, 2 ** -8, 1e-5)])
def test_low_precision_accumulates_in_fp32(fn, dtype, rel, tol):
    """fp32 / bf16 inputs: pairs and a_t of the input dtype; each a_t equals the fp64 attention over the
    pairs the scan produced up to the rounding of a_t itself (bf16: half an ulp, 2^-8 relative;
    measured 2.4e-7 in fp32, bf16 within 2e-6 of the bound). Accumulating in bf16 breaks the bound
    by 8e-3 at N = 64."""
    q, k_tmp, v_tmp = (x.detach().to(dtype) for x in inputs(64))
    step = Step().to(dtype)
    with torch.no_grad():
        k, v = fn(q, k_tmp, v_tmp, step, scale=SCALE, slopes=slopes(True, dtype))
    a = torch.stack(step.seen, 2)
    assert k.dtype == v.dtype == a.dtype == dtype
    ref = attention_given_pairs(*(x.double() for x in (q, k_tmp, v_tmp, k, v)), alibi=True)
    assert ((a.double() - ref).abs() - rel * ref.abs()).max().item() < tol


@pytest.mark.parametrize("fn", [scan, naive_scan])
@pytest.mark.parametrize("change,message", [
    (dict(k_tmp=torch.zeros(B, H, 5, HD)), r"k_tmp \(2, 2, 5, 4\) .* same"),
    (dict(q=torch.zeros(B, 6, HD)), r"q must be a \(B, H, N, hd\) tensor, got \(2, 6, 4\)"),
    (dict(q=torch.zeros(B, H, 0, HD), k_tmp=torch.zeros(B, H, 0, HD), v_tmp=torch.zeros(B, H, 0, HD)),
     "N=0"),
    (dict(scale=0.0), "scale=0.0 must be"),
    (dict(slopes=torch.ones(3)), r"slopes must be None or an \(H,\) = \(2,\) tensor, got \(3,\)"),
    (dict(step=lambda t, a: (a, a[..., :2])), r"step\(0, a\) returned v of shape \(2, 2, 2\)"),
])
def test_bad_input_is_named(fn, change, message):
    x = torch.zeros(B, H, 6, HD)
    args = {**dict(q=x, k_tmp=x, v_tmp=x, step=lambda t, a: (a, a), scale=1.0), **change}
    with pytest.raises(ValueError, match=message):
        fn(args.pop("q"), args.pop("k_tmp"), args.pop("v_tmp"), args.pop("step"), **args)
