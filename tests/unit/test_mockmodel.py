import json
import subprocess
import sys

from m3deploy.controller import mockmodel


def test_deterministic_and_big_enough(tmp_path):
    d1 = mockmodel.write_model_dir(tmp_path / "a")
    # a second build in a fresh process (different hash seeds, thread scheduling) gives the same bytes
    out = subprocess.run([sys.executable, "-m", "m3deploy.controller.mockmodel", str(tmp_path / "b")],
                         capture_output=True, text=True, check=True, env={"PYTHONHASHSEED": "123",
                                                                         "PATH": "/usr/bin:/bin"})
    assert out.stdout.split()[-1] == d1
    for name in mockmodel.FILES:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    tok = json.loads((tmp_path / "a" / "tokenizer.json").read_text())
    assert len(tok["model"]["vocab"]) >= mockmodel.MIN_VOCAB
    cfg = json.loads((tmp_path / "a" / "config.json").read_text())
    assert cfg["vocab_size"] >= 2000


def test_ids_1000_to_1999_decode_to_text(tmp_path):
    from tokenizers import Tokenizer
    mockmodel.write_model_dir(tmp_path)
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    text = tok.decode(list(range(1000, 2000)))
    assert len(text) > 1000


def test_chat_template_thinking_mode_and_tools(tmp_path):
    import jinja2
    mockmodel.write_model_dir(tmp_path)
    tcfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    env = jinja2.Environment()
    env.filters["tojson"] = lambda v: json.dumps(v)
    t = env.from_string(tcfg["chat_template"])
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]
    base = dict(messages=msgs, bos_token=tcfg["bos_token"], add_generation_prompt=True)
    assert t.render(**base, thinking_mode="enabled").endswith("<|im_start|>assistant\n<mm:think>\n")
    assert t.render(**base, thinking_mode="disabled").endswith("<mm:think>\n</mm:think>\n\n")
    assert t.render(**base).endswith("<|im_start|>assistant\n")  # adaptive (unset)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    hist = msgs + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "P"}'}}]},
        {"role": "tool", "content": "sunny"}]
    out = t.render(**dict(base, messages=hist), tools=tools)
    assert '"name": "get_weather"' in out and "<tool_response>sunny</tool_response>" in out
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "P"}}</tool_call>' in out
