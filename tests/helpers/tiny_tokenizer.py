"""A tiny byte-level BPE tokenizer with BOS, EOS and a chat template, built with `tokenizers`.

Byte-level BPE like GPT-2, Llama 3, Qwen2 and SmolLM2, trained in a few
milliseconds on a handful of sentences to a 320-token vocabulary. Being a real
BPE matters: transformers 5 rebuilds some families' tokenizers (Qwen2) from
tokenizer.json's vocabulary and merges, and that must give the same tokens.
"""
from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

SPECIALS = ["<pad>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]
PAD, BOS, EOS = 0, 1, 2
VOCAB_SIZE = 320  # 6 specials + 256 bytes + 58 merges
CORPUS = [
    "The cat sat on the mat. The dog ran to the house.",
    "Hello world! What is the answer to the question?",
    "One, two, three, four, five, six, seven, eight, nine, ten.",
    "def add(a, b):\n    return a + b\n",
    "A small model is good for tests; a big model is good for answers.",
    "the sun, the moon and the stars are in the sky",
]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def make_tiny_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", BOS)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.add_special_tokens({"additional_special_tokens": SPECIALS[3:]})
    fast.chat_template = CHAT_TEMPLATE
    return fast
