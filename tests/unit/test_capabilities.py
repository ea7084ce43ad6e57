from switchyard.core.capabilities import Capabilities, needs
from switchyard.core.chat_wire import ChatCompletionRequest, CompletionRequest


def _chat(**fields) -> ChatCompletionRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    return ChatCompletionRequest.model_validate(body)


def test_a_plain_chat_needs_nothing():
    assert needs(_chat()) == {}
    assert needs(_chat(tool_choice="none", logprobs=False, n=1)) == {}


def test_each_capability_is_found_with_the_parameter_that_needs_it():
    assert needs(_chat(tools=[{"type": "function", "function": {"name": "f"}}])) == {"tools": "tools"}
    assert needs(_chat(tool_choice="required")) == {"tools": "tool_choice"}
    assert needs(_chat(response_format={"type": "json_object"})) == {"json_object": "response_format"}
    assert needs(_chat(response_format={"type": "json_schema", "json_schema": {}})) == {
        "json_schema": "response_format"
    }
    assert needs(_chat(response_format={"type": "text"})) == {}
    assert needs(_chat(top_logprobs=2)) == {"logprobs": "top_logprobs"}
    assert needs(_chat(logprobs=True, n=3)) == {"logprobs": "logprobs", "n": "n"}


def test_the_history_needs_tools_and_vision():
    history = [
        {"role": "user", "content": [{"type": "text", "text": "what is this"}, {"type": "image_url", "image_url": {}}]},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function"}]},
        {"role": "tool", "tool_call_id": "c", "content": "42"},
    ]
    request = ChatCompletionRequest.model_validate({"model": "m", "messages": history})
    assert needs(request) == {"tools": "messages", "vision": "messages"}


def test_a_legacy_completion_needs_logprobs_and_n_only():
    request = CompletionRequest.model_validate({"model": "m", "prompt": "hi", "logprobs": 2, "n": 2})
    assert needs(request) == {"logprobs": "logprobs", "n": "n"}


def test_overrides_replace_key_by_key_and_lacks_names_the_parameter():
    caps = Capabilities().overridden({"vision": False, "tools": None, "unknown": True, "context_window": 8})
    assert (caps.vision, caps.tools, caps.context_window) == (False, True, 8)
    needed = needs(_chat(tools=[{}], messages=[{"role": "user", "content": [{"type": "image_url"}]}]))
    assert caps.lacks(needed) == [("vision", "messages")]
    assert Capabilities(tools=False, vision=False).lacks(needed) == [("tools", "tools"), ("vision", "messages")]


def test_the_legacy_function_fields_need_tools_and_a_logprobs_of_0_needs_logprobs():
    assert needs(_chat(functions=[{"name": "f"}])) == {"tools": "functions"}
    assert needs(_chat(function_call="auto")) == {"tools": "function_call"}
    assert needs(_chat(function_call="none")) == {}
    history = [{"role": "function", "name": "f", "content": "42"}]
    assert needs(ChatCompletionRequest.model_validate({"model": "m", "messages": history})) == {"tools": "messages"}
    request = CompletionRequest.model_validate({"model": "m", "prompt": "hi", "logprobs": 0})
    assert needs(request) == {"logprobs": "logprobs"}


def test_a_request_read_from_its_body_needs_what_the_same_request_built_from_fields_needs():
    history = [
        {"role": "user", "content": [{"type": "image_url", "image_url": {}}]},
        {"role": "tool", "tool_call_id": "c", "content": "42"},
    ]
    bodies = [
        {"model": "m", "messages": history, "logprobs": True, "n": 2},
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "functions": [{"name": "f"}]},
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_object"}},
    ]
    for body in bodies:
        read = ChatCompletionRequest.from_payload(body)
        assert read.payload is body
        assert needs(read) == needs(ChatCompletionRequest.model_validate(body)) != {}
    request = CompletionRequest.from_payload({"model": "m", "prompt": "hi"})
    request.set_field("n", 3)
    assert needs(request) == {"n": "n"}
