"""An independent multiple-choice accuracy computation to check lm-evaluation-harness against.

`own_accuracy(model, items)`: acc / acc_norm / acc_bytes computed here from per-choice
log-likelihoods, tokenised and scored the way lm-eval 0.4.13 does for a causal "hf" model, from an
HF directory or from any `logits_fn(ids (1, T)) -> logits (1, T, V)` (e.g. the native rgpt model).

What lm-eval does for a zero-shot multiple-choice doc (lm_eval/api/task.py, lm_eval/api/model.py,
lm_eval/models/huggingface.py), reproduced in `own_accuracy`:
  context = doc_to_text(doc) (no description, no few-shot), continuation = target_delimiter + choice;
  `_encode_pair`: trailing whitespace of the context moves to the front of the continuation, then
  context_enc = enc(context), continuation_enc = enc(context + continuation)[len(context_enc):]
  (an empty context becomes [prefix_token_id] = BOS, else EOS); the model sees
  (context_enc + continuation_enc)[-(max_length + 1):][:-1]; the score is the float32 sum of
  log_softmax(logits) at the continuation tokens; pred = argmax (first on ties), acc_norm divides by
  len(choice) in *characters*, acc_bytes by len(choice.encode("utf-8")); metrics are plain means.
With batch_size=1 lm-eval runs the very same forward passes, so the log-likelihoods agree bitwise; with
larger batches right-padding changes matrix shapes and hence float rounding (not the method).
"""
from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from rgpt_dist.data.tokenizer import EOT_TOKEN, get_encoding
from rgpt_dist.eval.harness import BUNDLED_TASK_DATA, EXAMPLE_TASK, HarnessError, hf_model_args


def load_task_items(task_data: str | Path | Sequence[Mapping[str, Any]] = EXAMPLE_TASK) -> list[dict]:
    """Items {"question", "choices", "gold"} from a bundled task name, a JSON Lines file or a list."""
    if isinstance(task_data, (str, Path)):
        path = BUNDLED_TASK_DATA.get(str(task_data), Path(task_data))
        if not Path(path).is_file():
            raise HarnessError(f"{task_data!r} is neither a bundled task ({', '.join(BUNDLED_TASK_DATA)}) "
                               f"nor a JSON Lines file")
        rows = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    else:
        rows = [dict(r) for r in task_data]
    for i, r in enumerate(rows):
        missing = {"question", "choices", "gold"} - set(r)
        if missing:
            raise HarnessError(f"item {i} lacks {sorted(missing)}")
    return rows


def _hf_tokenizer_encoder(tok) -> Callable[[str], list[int]]:
    """lm-eval's HFLM.tok_encode with add_special_tokens=None and add_bos_token unset: the tokenizer's
    default special-token handling, except for a string that already starts with the prefix token."""
    prefix = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    prefix_str = tok.decode(prefix) if prefix is not None else None

    def encode(s: str) -> list[int]:
        if prefix_str and s.startswith(prefix_str):
            return tok.encode(s, add_special_tokens=False)
        return tok.encode(s)
    return encode


def _encoder(tokenizer) -> Callable[[str], list[int]]:
    if tokenizer is None:
        tokenizer = get_encoding()
    if hasattr(tokenizer, "encode_ordinary"):  # tiktoken: plain text, special tokens not parsed
        return tokenizer.encode_ordinary
    if hasattr(tokenizer, "convert_tokens_to_ids"):  # transformers tokenizer
        return _hf_tokenizer_encoder(tokenizer)
    if callable(tokenizer):
        return tokenizer
    raise TypeError(f"tokenizer must be a tiktoken Encoding, a transformers tokenizer or a callable, "
                    f"not {type(tokenizer).__name__}")


def encode_pair(encode: Callable[[str], list[int]], context: str, continuation: str,
                prefix_token_id: int) -> tuple[list[int], list[int]]:
    """lm-eval's (context_enc, continuation_enc) for a causal model."""
    if context == "":
        cont = encode(continuation)
        return ([prefix_token_id], cont) if prefix_token_id != cont[0] else (cont[:1], cont[1:])
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces > 0:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = encode(context + continuation)
    ctx = encode(context)
    return ctx, whole[len(ctx):]


def _hf_max_length(config, tokenizer, default: int = 2048) -> int:
    for cfg in (getattr(config, "text_config", None), config):
        if cfg is None:
            continue
        for attr in ("n_positions", "max_position_embeddings", "n_ctx"):
            value = getattr(cfg, attr, None)
            if isinstance(value, int) and value > 0:
                return value
    mml = getattr(tokenizer, "model_max_length", None)
    if isinstance(mml, int) and 0 < mml < 10 ** 29:
        return mml
    return default


def load_hf_scorer(hf_dir: str | Path, model_args_extra=None, device: str = "cpu", remote_code: str = "auto"):
    """(logits_fn, transformers tokenizer, max_length) for an exported directory, loaded as lm-eval
    loads it: AutoModelForCausalLM, trust_remote_code as the `remote_code` policy allows, dtype from
    the config, extra from_pretrained overrides such as r_eval."""
    from transformers import AutoModelForCausalLM, AutoTokenizer  # transformers only for scoring a Hugging Face export

    args = hf_model_args(hf_dir, model_args_extra, remote_code)
    path = args.pop("pretrained")
    trust = bool(args.pop("trust_remote_code"))
    args.setdefault("dtype", "auto")
    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust)
    model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=trust, **args).to(device).eval()
    model.tie_weights()

    def logits_fn(ids):
        with torch.no_grad():
            return model(ids.to(device)).logits
    return logits_fn, tok, _hf_max_length(model.config, tok)


def own_accuracy(model: str | Path | Callable, task_data: str | Path | Sequence[Mapping] = EXAMPLE_TASK, *,
                 tokenizer=None, target_delimiter: str = " ", max_length: int | None = None,
                 prefix_token_id: int | None = None, model_args_extra=None, limit: int | None = None,
                 device: str = "cpu", remote_code: str = "auto") -> dict[str, Any]:
    """Zero-shot multiple-choice accuracy computed here, independently of lm-eval's code, the way
    lm-eval scores a causal model (see the module docstring).

    model: an exported HF directory (loaded as lm-eval loads it, with `model_args_extra` such as
    {"r_eval": 4}) or `logits_fn(ids: LongTensor (1, T)) -> logits (1, T, V)`. For a callable,
    `tokenizer` defaults to the project's GPT-2 BPE (tiktoken), `prefix_token_id` to <|endoftext|>
    and `max_length` to no truncation. task_data: a bundled task name, a JSON Lines file or a list of
    {"question", "choices", "gold" (index or choice text)}; limit: the first `limit` items (as lm-eval's
    integer --limit). Returns {"acc", "acc_norm", "acc_bytes", "n", "items": [per item: doc_id, lls,
    is_greedy, pred, pred_norm, pred_bytes, gold, acc, acc_norm, acc_bytes]}."""
    if callable(model) and not isinstance(model, (str, Path)):
        logits_fn, encode = model, _encoder(tokenizer)
        if prefix_token_id is None:
            prefix_token_id = EOT_TOKEN
    else:
        logits_fn, tok, hf_max = load_hf_scorer(model, model_args_extra, device, remote_code)
        encode = _encoder(tokenizer if tokenizer is not None else tok)
        max_length = hf_max if max_length is None else max_length
        if prefix_token_id is None:
            prefix_token_id = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id

    rows = load_task_items(task_data)
    if limit is not None:
        rows = rows[:int(limit)]

    def loglikelihood(doc_id: int, question: str, choice: str) -> tuple[float, bool]:
        ctx, cont = encode_pair(encode, question, f"{target_delimiter}{choice}", prefix_token_id)
        if not cont:
            raise HarnessError(f"item {doc_id}: choice {choice!r} encodes to no tokens")
        return _continuation_loglikelihood(logits_fn, ctx + cont, len(cont), max_length)

    items = [_score_item(doc_id, row, loglikelihood) for doc_id, row in enumerate(rows)]
    if not items:
        raise HarnessError("no items to score")
    return {
        **{m: sum(it[m] for it in items) / len(items) for m in ("acc", "acc_norm", "acc_bytes")},
        "n": len(items),
        "items": items,
    }


def _continuation_loglikelihood(logits_fn: Callable, seq: list[int], n_cont: int,
                                max_length: int | None) -> tuple[float, bool]:
    """log p(last n_cont tokens of seq | the tokens before them), and whether each of them is the
    argmax; the input is left-truncated to max_length tokens, as lm-eval does."""
    if max_length is not None:
        seq = seq[-(max_length + 1):]
    inp = torch.tensor([seq[:-1]], dtype=torch.long)                    # (1, T)
    logits = logits_fn(inp)
    if logits.dim() != 3 or logits.shape[:2] != inp.shape:
        raise ValueError(f"logits_fn must return (1, T, V) logits for ids (1, T), got {tuple(logits.shape)}")
    logp = F.log_softmax(logits.detach().cpu(), dim=-1)[0]               # (T, V)
    T = inp.shape[1]
    scored = logp[T - n_cont:T]                                          # (n_cont, V)
    target = torch.tensor(seq[-n_cont:], dtype=torch.long)
    return (float(scored.gather(-1, target[:, None]).squeeze(-1).sum()),
            bool((scored.argmax(-1) == target).all()))


def _score_item(doc_id: int, row: Mapping, loglikelihood: Callable) -> dict[str, Any]:
    """One multiple-choice item: the choices' log-likelihoods and the three predictions (raw, per
    character, per UTF-8 byte) against the gold index (-100 where a gold text is not a choice)."""

    choices = list(row["choices"])
    gold = row["gold"]
    if isinstance(gold, str):
        gold = choices.index(gold) if gold in choices else -100
    lls, greedy = zip(*(loglikelihood(doc_id, row["question"], choice) for choice in choices))
    ll = np.array(lls, dtype=np.float64)
    pred = int(np.argmax(ll))
    pred_norm = int(np.argmax(ll / np.array([float(len(c)) for c in choices])))
    pred_bytes = int(np.argmax(ll / np.array([float(len(c.encode("utf-8"))) for c in choices])))
    return {"doc_id": doc_id, "lls": list(lls), "is_greedy": list(greedy), "pred": pred,
            "pred_norm": pred_norm, "pred_bytes": pred_bytes, "gold": gold,
            "acc": 1.0 if pred == gold else 0.0, "acc_norm": 1.0 if pred_norm == gold else 0.0,
            "acc_bytes": 1.0 if pred_bytes == gold else 0.0}
