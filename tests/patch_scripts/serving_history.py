"""Run in an SGLang 0.5.23 interpreter: one chat request through SGLang's own OpenAIServingChat.

Prints one JSON object: the prompt the tokenizer manager received (decoded from its input_ids)
and the response's tool calls; then, under "same_id" and "empty_id", the prompts of a parallel turn
whose two calls share one id (or carry none) with their two tool results. argv[1]: scratch folder. The history carries ids sanitised the way
LiteLLM-style clients send them back (functions_get_weather_0); the scripted model answers with
the id style it saw (shared/notes/tool-call-failures.md item 2).

Stand-ins (nothing else is faked): the tokenizer manager (no GPU: generate_request replays a fixed
output and records the request) and the model config. The tokenizer is a real byte-level HF
tokenizer with Kimi's markers as single special tokens and a Kimi-style chat template (ids copied
verbatim into the prompt, as moonshotai/Kimi-K2.5's template does).
"""
import argparse, asyncio, json, sys
from pathlib import Path
from types import SimpleNamespace

MARKERS = ["<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>",
           "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
           "<|tool_call_argument_begin|>", "<|tool_call_end|>", "[BOS]", "[EOS]"]
TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'assistant' -%}<|im_assistant|>assistant<|im_middle|>{{ m.get('content') or '' }}"
    "{%- if m.get('tool_calls') -%}<|tool_calls_section_begin|>{%- for tc in m['tool_calls'] -%}"
    "<|tool_call_begin|>{{ tc['id'] }}<|tool_call_argument_begin|>{{ tc['function']['arguments'] }}<|tool_call_end|>"
    "{%- endfor -%}<|tool_calls_section_end|>{%- endif -%}<|im_end|>"
    "{%- elif m['role'] == 'tool' -%}<|im_system|>tool<|im_middle|>## Return of {{ m.get('tool_call_id') }}\n"
    "{{ m.get('content') }}<|im_end|>"
    "{%- else -%}<|im_user|>{{ m['role'] }}<|im_middle|>{{ m.get('content') }}<|im_end|>{%- endif -%}"
    "{%- endfor -%}{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
)
OUTPUT = ("<|tool_calls_section_begin|><|tool_call_begin|>functions_get_weather_1<|tool_call_argument_begin|>"
          '{"city": "Melbourne, Australia"}<|tool_call_end|><|tool_calls_section_end|>')


def build_model_dir(folder: Path) -> Path:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    folder.mkdir(parents=True, exist_ok=True)
    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in MARKERS])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "[BOS]", "eos_token": "<|im_end|>",
        "pad_token": "[EOS]", "chat_template": TEMPLATE}))
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "num_attention_heads": 4, "num_hidden_layers": 2,
        "num_key_value_heads": 4, "vocab_size": 512, "max_position_embeddings": 4096}))
    return folder


class TokenizerManager:
    """Stand-in for SGLang's TokenizerManager: records the request, replays OUTPUT."""

    def __init__(self, server_args, tokenizer):
        from transformers import PretrainedConfig

        self.server_args, self.tokenizer = server_args, tokenizer
        self.model_path = server_args.model_path
        self.served_model_name = "kimi"
        self.model_config = SimpleNamespace(
            hf_config=PretrainedConfig(architectures=["LlamaForCausalLM"]), context_len=4096,
            is_multimodal=False, get_default_sampling_params=lambda: {})
        self.request_logger = SimpleNamespace(log_requests=False, log_requests_level=0,
                                              log_openai_received_request=lambda *a, **k: None)
        self.received = []

    def config_value(self, name):
        return getattr(self.server_args, name, None)

    def create_abort_task(self, obj):
        return None

    async def generate_request(self, obj, raw_request=None):
        self.received.append(obj)
        ids = self.tokenizer.encode(OUTPUT, add_special_tokens=False)
        yield {"text": OUTPUT, "output_ids": ids, "index": 0, "meta_info": {
            "id": "r1", "prompt_tokens": 10, "completion_tokens": len(ids), "cached_tokens": 0,
            "finish_reason": {"type": "stop", "matched": None}, "output_token_logprobs": [],
            "output_top_logprobs": [], "weight_version": "default"}}


async def main(scratch: Path) -> dict:
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_tokenizer
    from transformers import AutoTokenizer

    model_dir = build_model_dir(scratch / "model")
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    server_args = ServerArgs.from_cli_args(parser.parse_args([
        "--model-path", str(model_dir), "--skip-tokenizer-init", "--device", "cpu",
        "--tool-call-parser", "kimi_k2"]))
    set_global_server_args_for_tokenizer(server_args)
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
    from sglang.srt.parser.template_manager import TemplateManager

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    tm = TokenizerManager(server_args, tokenizer)
    templates = TemplateManager()
    templates.initialize_templates(tokenizer_manager=tm, model_path=str(model_dir),
                                   chat_template=None, completion_template=None)
    serving = OpenAIServingChat(tm, templates)
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    async def ask(messages):
        request = ChatCompletionRequest(model="kimi", tools=[weather], messages=messages)
        response = await serving.handle_request(request, None)
        body = json.loads(response.body) if hasattr(response, "body") else response.model_dump()
        obj = tm.received[-1]
        ids = obj.input_ids[0] if obj.input_ids and isinstance(obj.input_ids[0], list) else obj.input_ids
        prompt = tokenizer.decode(ids, skip_special_tokens=False) if ids else (obj.text or "")
        return prompt, body

    prompt, body = await ask([
        {"role": "user", "content": "Weather in Sydney, then Melbourne?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "functions_get_weather_0", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Sydney\"}"}}]},
        {"role": "tool", "tool_call_id": "functions_get_weather_0", "content": "18C"},
    ])
    message = body["choices"][0]["message"]
    out = {"prompt": prompt, "tool_calls": message.get("tool_calls") or [],
           "content": message.get("content"), "finish_reason": body["choices"][0]["finish_reason"]}
    # one parallel assistant turn whose two calls share one id (or have none): results by position
    for label, cid in (("same_id", "call_1"), ("empty_id", "")):
        calls = [{"id": cid, "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(
            {"city": city})}} for city in ("Sydney", "Perth")]
        prompt, _ = await ask([
            {"role": "user", "content": "Weather in Sydney and Perth?"},
            {"role": "assistant", "content": "", "tool_calls": calls},
            {"role": "tool", "tool_call_id": cid, "content": "18C"},
            {"role": "tool", "tool_call_id": cid, "content": "25C"},
        ])
        out[label] = prompt
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(Path(sys.argv[1])))))
