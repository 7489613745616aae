"""The OpenAI Python client against the simulator, streaming and not, chat and completions."""
import openai
import pytest

from sim_server_helpers import MODEL


@pytest.fixture(scope="module")
def client(sim):
    with openai.OpenAI(base_url=sim.url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


def test_models_lists_the_served_model(client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert models.data[0].owned_by == "vllm"
    assert models.data[0].model_extra["max_model_len"] == 4096


def test_completion_non_streaming(client):
    r = client.completions.create(model=MODEL, prompt="The quick brown fox", max_tokens=12,
                                  seed=1, extra_body={"ignore_eos": True})
    assert r.object == "text_completion" and r.id.startswith("cmpl-")
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + 12
    assert len(r.choices[0].text.split()) >= 3


def test_completion_streaming_matches_non_streaming(client):
    kw = dict(model=MODEL, prompt="Once upon a time", max_tokens=16, seed=5, temperature=0.8,
              extra_body={"ignore_eos": True})
    whole = client.completions.create(**kw).choices[0].text
    chunks = list(client.completions.create(stream=True,
                                            stream_options={"include_usage": True}, **kw))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 16
    finals = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finals[-1] == "length" and set(finals[:-1]) == {None}


def test_chat_streaming_and_not(client):
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Tell me about the sea."}]
    r = client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=20,
                                       seed=11, extra_body={"ignore_eos": True})
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.usage.completion_tokens == 20
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=20,
                                            seed=11, stream=True,
                                            stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == r.choices[0].message.content
    assert chunks[-1].usage.prompt_tokens == r.usage.prompt_tokens


def test_natural_stop_respects_min_tokens(client):
    # Without ignore_eos the "model" stops after a sentence, deterministically per prompt+seed.
    kw = dict(model=MODEL, prompt="Say something wise.", max_tokens=3000, seed=2)
    a = client.completions.create(**kw)
    b = client.completions.create(**kw)
    assert a.choices[0].finish_reason == "stop"
    assert a.choices[0].text == b.choices[0].text
    assert a.choices[0].text.rstrip()[-1] in ".!?"
    n = a.usage.completion_tokens
    longer = client.completions.create(**kw, extra_body={"min_tokens": n + 50})
    assert longer.usage.completion_tokens >= n + 51
    assert longer.choices[0].finish_reason == "stop"


def test_errors_through_the_client(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="no/such-model", prompt="x", max_tokens=1)
    assert e.value.body["message"] == "The model `no/such-model` does not exist."
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="hello", max_tokens=5000)
    assert "is too large: 5000" in e.value.body["message"]
