"""The recorder's per-token texts: each token's decoded text, joined equal to ``tokenizer.decode(ids)``,
for a byte-level BPE tokenizer (the tiny world's) and a sentencepiece-style one (``▁`` for spaces, byte
fallback), both built here; a character whose bytes span several tokens goes whole to the last of them."""

import random

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from marsrl.experiment.recorder import token_texts
from marsrl.tinyworld.tokenizer import train_tokenizer

TEXT = "the answer is café 😀 中\n#### 42"
# what each token of TEXT shows: the emoji's 4 bytes and 中's 3 are separate tokens in both tokenizers
# (neither saw them in training), the character shown once, on the token that completes it; EOS shows ""
WANT = [
    "the",
    " answer",
    " is",
    " café",
    " ",
    "",
    "",
    "",
    "😀",
    " ",
    "",
    "",
    "中",
    "\n",
    "####",
    " ",
    "4",
    "2",
    "",
]


@pytest.fixture(scope="module")
def byte_level():
    return train_tokenizer(["the answer is 42\n#### 42 café"] * 50, vocab_size=300)


@pytest.fixture(scope="module")
def sentencepiece():
    """A Llama-style sentencepiece tokenizer: unigram pieces with ``▁`` for a space, bytes as
    ``<0xNN>`` pieces for what the vocabulary lacks, and Llama's decoder (▁ -> space, bytes fused, the
    leading space stripped)."""
    pieces = [("<unk>", 0.0), ("</s>", 0.0)] + [(f"<0x{b:02X}>", -10.0) for b in range(256)]
    words = ["▁", "▁the", "▁answer", "▁is", "▁café", "#", "##", "####", "4", "2", "\n", "a", "e", "t", "h"]
    pieces += [(w, -1.0 - 0.1 * len(w)) for w in words]
    tok = Tokenizer(models.Unigram(pieces, unk_id=0, byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="</s>")


@pytest.mark.parametrize("kind", ["byte_level", "sentencepiece"])
def test_token_texts_join_to_the_decoded_completion(kind, request):
    tok = request.getfixturevalue(kind)
    ids = [*tok.encode(TEXT), tok.eos_token_id]
    assert len(ids) == len(WANT) and all(tok.decode([i]) == "\ufffd" for i in ids[5:9])  # 😀: 4 byte tokens
    texts = token_texts(tok, ids)
    assert texts == WANT
    assert "".join(texts) == tok.decode(ids, skip_special_tokens=True) == TEXT
    assert "".join(token_texts(tok, ids, skip_special_tokens=False)) == tok.decode(ids)


@pytest.mark.parametrize("kind", ["byte_level", "sentencepiece"])
def test_random_ids_join_and_keep_characters_whole(kind, request):
    """Seed 0, 200 random id sequences of 1-40 tokens (broken UTF-8 among them): the texts always join to
    the decoded text, and no token shows U+FFFD unless the decoded text itself has one there."""
    tok = request.getfixturevalue(kind)
    rng = random.Random(0)
    for _ in range(200):
        ids = [rng.randrange(len(tok)) for _ in range(rng.randint(1, 40))]
        texts = token_texts(tok, ids)
        full = tok.decode(ids, skip_special_tokens=True)
        assert "".join(texts) == full and len(texts) == len(ids)
        assert sum(t.count("\ufffd") for t in texts) == full.count("\ufffd")


def test_empty_completion(byte_level):
    assert token_texts(byte_level, []) == []
