"""Build a small HF tokenizer folder with Kimi K2.x's special tokens and a Kimi-style chat template.

Runs inside the SGLang test environment (needs ``tokenizers`` and ``transformers``). Nothing
is downloaded: the vocabulary is the 256 byte-level symbols plus Kimi's markers, each marker
one token as in moonshotai/Kimi-K2.5's tokenizer (``<|tool_calls_section_begin|>`` ...
``<|tool_call_end|>``, ``<|im_*|>``; ``<think>``/``</think>`` are single, non-special tokens).
The model folder also gets a small ``config.json`` so SGLang's ServerArgs accept it as a
local ``--model-path``.
"""

from __future__ import annotations

import json
from pathlib import Path

#: Kimi K2.x special tokens (moonshotai/Kimi-K2.5 tokenizer_config.json, added_tokens_decoder).
SPECIAL_TOKENS = [
    "[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>",
    "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>", "<|tool_call_end|>",
]
#: Single tokens that decode even with skip_special_tokens (as in Kimi's tokenizer).
PLAIN_ADDED = ["<think>", "</think>"]

CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 128, "num_attention_heads": 4, "num_hidden_layers": 2,
    "num_key_value_heads": 4, "vocab_size": 512, "max_position_embeddings": 262144,
}


def build(folder: Path) -> Path:
    """Write ``tokenizer.json``, ``tokenizer_config.json``, ``config.json`` into ``folder``; returns it."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    folder.mkdir(parents=True, exist_ok=True)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in PLAIN_ADDED])
    tok.save(str(folder / "tokenizer.json"))
    template = (Path(__file__).parent / "kimi_template.jinja").read_text()
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "[BOS]", "eos_token": "<|im_end|>", "pad_token": "[EOS]",
        "model_max_length": 262144, "chat_template": template,
    }, indent=1))
    (folder / "config.json").write_text(json.dumps(CONFIG, indent=1))
    return folder
