"""GPT-2 tokenizer files for an export directory, built offline from the project's verified
`gpt2.tiktoken` (rgpt_dist.data.tokenizer) by transformers' tiktoken converter, so that
`AutoTokenizer.from_pretrained(export_dir)` works without network access."""
from __future__ import annotations

import json
from pathlib import Path

from rgpt_dist.data.tokenizer import EOT_TOKEN, VocabularyUnavailable, find_vocab, get_encoding

EOT = "<|endoftext|>"


def write_tokenizer(out_dir: Path, model_max_length: int) -> None:
    """tokenizer.json (byte-level BPE, GPT-2's pre-tokenizer) + tokenizer_config.json + special tokens."""
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

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
