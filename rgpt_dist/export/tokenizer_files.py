"""Tokenizer files for an export directory, so that `AutoTokenizer.from_pretrained(export_dir)`
works without network access: GPT-2's, built offline from the project's verified `gpt2.tiktoken`
(rgpt_dist.data.tokenizer) by transformers' tiktoken converter, or, for a run of an algorithmic task
(`data.task`), that task's vocabulary (`write_task_tokenizer`)."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Sequence

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import TikTokenConverter

from rgpt_dist.data.suites import not_a_task, suite_of_task
from rgpt_dist.data.tokenizer import EOT_TOKEN, VocabularyUnavailable, find_vocab, get_encoding

EOT = "<|endoftext|>"


def write_tokenizer(out_dir: Path, model_max_length: int) -> None:
    """tokenizer.json (byte-level BPE, GPT-2's pre-tokenizer) + tokenizer_config.json + special tokens."""

    ranks = find_vocab()
    if ranks is None:
        raise VocabularyUnavailable("the GPT-2 vocabulary file is needed for the tokenizer files: run `make vocab`")
    enc = get_encoding(ranks)  # verifies the file's sha256
    backend = TikTokenConverter(vocab_file=str(ranks), pattern=enc._pat_str,
                                additional_special_tokens=[EOT]).converted()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=EOT, eos_token=EOT, unk_token=EOT,
                                  model_max_length=model_max_length, clean_up_tokenization_spaces=False)
    if tok.convert_tokens_to_ids(EOT) != EOT_TOKEN:
        raise RuntimeError(f"converted tokenizer maps {EOT} to {tok.convert_tokens_to_ids(EOT)}, not {EOT_TOKEN}")
    tok.save_pretrained(out_dir)
    cfg_path = out_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "GPT2TokenizerFast"
    cfg_path.write_text(json.dumps(cfg, indent=2))


def write_export_tokenizer(out_dir: Path, config: Any) -> None:
    """The tokenizer an export of a run with this config (rgpt_dist.config.Config) ships: its task's
    when data.task is set (rgpt_dist.data.suites: an algorithmic task's vocabulary), else GPT-2's."""
    task = getattr(config.data, "task", "")
    if task:
        suite = suite_of_task(task)
        if suite is None:
            raise ValueError(f"data.task={not_a_task(task)}")
        write_task_tokenizer(out_dir, suite.vocab(task), model_max_length=config.model.block_size, task=task)
    else:
        write_tokenizer(out_dir, model_max_length=config.model.block_size)


def write_task_tokenizer(out_dir: Path, vocab: Sequence[str], model_max_length: int, task: str = "") -> None:
    """An algorithmic task's tokenizer (rgpt_dist.algorithmic: id = index in `vocab`, whose first three
    are <pad>, <bos>, <eos>): a text is the concatenation of its tokens' symbols (as docs/algorithmic.md
    writes sequences), split longest symbol first, and decodes back to it; a text holding anything else
    is refused by the tokenizer (no unknown token). The special ids go into config.json (and
    generation_config.json where written): bos 1, eos 2, pad 0, in place of GPT-2's; config.json also
    names the task (`rgpt_task`: rgpt-eval lm-eval refuses such a model, its text tasks do not apply)."""

    pad, bos, eos = vocab[:3]
    backend = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(vocab)}, unk_token=None))
    symbols = sorted(vocab[3:], key=len, reverse=True)  # longest first: S5's 5-digit symbols
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("|".join(re.escape(t) for t in symbols)), behavior="isolated")
    backend.decoder = decoders.Fuse()                   # concatenation, no spaces added
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in (pad, bos, eos)])
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=bos, eos_token=eos, pad_token=pad,
                                  model_max_length=model_max_length, clean_up_tokenization_spaces=False)
    tok.save_pretrained(out_dir)
    for name in ("config.json", "generation_config.json"):
        path = Path(out_dir) / name
        if path.exists():
            record = json.loads(path.read_text())
            record.update(bos_token_id=1, eos_token_id=2, pad_token_id=0, **({"rgpt_task": task} if task else {}))
            path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
