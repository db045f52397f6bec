"""Fig. 4 top tokens: every step's exit distribution against a separate forward at that depth,
model(prompt, r=i) (which runs exactly i steps and then coda + head), and the derived numbers
against direct computations."""
import math

import torch

from rgpt_dist.eval.appendix import top_tokens
from tests.eval.appendix.conftest import R, V


def test_step_distributions_match_separate_forwards(model, batches):
    prompt = batches[1][0][2]                                            # (T,)
    probs = top_tokens.step_distributions(model, prompt, R)
    assert probs.shape == (R + 1, V)
    with torch.no_grad():
        for i in range(R + 1):
            expected = model(prompt[None], r=i).logits[0, -1, :V].float().softmax(-1)
            assert torch.allclose(probs[i], expected, atol=1e-6), i
    assert not torch.allclose(probs[0], probs[-1], atol=1e-3)          # the steps do change the prediction


def test_top_tokens_numbers():
    probs = torch.tensor([[0.5, 0.2, 0.2, 0.1], [0.1, 0.6, 0.2, 0.1], [0.05, 0.7, 0.05, 0.2]])
    t = top_tokens.top_tokens(probs, k=2)
    assert t["top_ids"] == [[0, 1], [1, 2], [1, 3]]
    assert t["final_top_ids"] == [1, 3]
    assert torch.allclose(torch.tensor(t["p_final_top1"]), torch.tensor([0.2, 0.6, 0.7]))
    assert torch.allclose(torch.tensor(t["final_top_probs"]), torch.tensor([[0.2, 0.6, 0.7], [0.1, 0.1, 0.2]]))
    entropy = [-sum(p * math.log(p) for p in row) for row in probs.tolist()]
    assert torch.allclose(torch.tensor(t["entropy"]), torch.tensor(entropy))


def test_run_writes_outputs(run_analysis, batches):
    res, data = run_analysis(top_tokens, decode=lambda ids: "".join(f"<{i}>" for i in ids))
    assert data["prompt"] == batches[0][0][0].tolist()                  # default: first row of the first batch
    assert data["top_tokens"][-1][0] == f"<{data['final_top_ids'][0]}>"
    assert len(res.rows) == (R + 1) * top_tokens.K
