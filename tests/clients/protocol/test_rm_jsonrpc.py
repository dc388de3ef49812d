"""Request validation and error codes of the wire protocol."""

from __future__ import annotations

import json

import pytest

from cod.protocol import jsonrpc as rpc
from cod.protocol.jsonrpc import Params, RpcError, parse_request


def body(obj) -> bytes:
    return json.dumps(obj).encode()


@pytest.mark.parametrize(
    "raw, code, needle",
    [
        (b"\xff\xfe\x00garbage", rpc.PARSE_ERROR, "UTF-8 JSON"),
        (b"{not json", rpc.PARSE_ERROR, "JSON"),
        (body([1, 2]), rpc.INVALID_REQUEST, "object"),
        (body({"id": 1, "method": "hello"}), rpc.INVALID_REQUEST, "jsonrpc"),
        (body({"jsonrpc": "2.0", "id": 1}), rpc.INVALID_REQUEST, "method"),
        (body({"jsonrpc": "2.0", "id": 1, "method": 7}), rpc.INVALID_REQUEST, "method"),
        (body({"jsonrpc": "2.0", "id": 1, "method": "x", "params": [1]}), rpc.INVALID_REQUEST, "params"),
        (body({"jsonrpc": "2.0", "id": [1], "method": "x"}), rpc.INVALID_REQUEST, "id"),
    ],
)
def test_bad_requests_get_the_standard_codes(raw, code, needle):
    with pytest.raises(RpcError) as err:
        parse_request(raw)
    assert err.value.code == code
    assert needle in err.value.message


def test_invalid_request_keeps_the_id_so_the_reply_can_be_matched():
    with pytest.raises(RpcError) as err:
        parse_request(body({"id": 42, "method": "hello"}))
    assert err.value.data == {"id": 42}


def test_valid_request_is_parsed():
    req = parse_request(body({"jsonrpc": "2.0", "id": "a", "method": "hello", "params": {"version": 1}}))
    assert (req.method, req.params, req.id) == ("hello", {"version": 1}, "a")


@pytest.mark.parametrize(
    "getter, value, ok",
    [("int", 3, True), ("int", True, False), ("int", "3", False), ("str", "x", True), ("str", 1, False),
     ("bool", False, True), ("bool", 0, False), ("number", 1.5, True), ("dict", {}, True), ("dict", [], False),
     ("str_list", ["a"], True), ("str_list", ["a", 1], False)],
)
def test_params_check_types_and_name_the_field(getter, value, ok):
    p = Params("m", {"f": value})
    if ok:
        assert getattr(p, getter)("f") == value
    else:
        with pytest.raises(RpcError) as err:
            getattr(p, getter)("f")
        assert err.value.code == rpc.INVALID_PARAMS and "'f'" in err.value.message


def test_params_refuse_missing_and_unknown_fields():
    with pytest.raises(RpcError, match="missing parameter 'name'"):
        Params("register_task", {}).str("name")
    p = Params("register_task", {"name": "a", "max_core": 3})
    p.str("name")
    with pytest.raises(RpcError, match="max_core"):
        p.done()


@pytest.mark.parametrize("skb_code, code", [("syntax_error", -32040), ("unsafe", -32041), ("timeout", -32042),
                                            ("invalid", -32051), ("no_such_code", -32050)])
def test_skb_error_codes_have_a_fixed_place(skb_code, code):
    assert rpc.skb_error_code(skb_code) == code


def _request(params_json: str) -> str:
    return '{"jsonrpc": "2.0", "id": 1, "method": "x", "params": ' + params_json + "}"


DEEP = "[" * 70 + "]" * 70
PLAINLY = [
    # (what, the frame's text, plainly fine?, its problem's code or None)
    ("a registration-like request", _request('{"facts": ["a(1)", "b(2)"], "props": {"k": [1, 2]}}'), True, None),
    ("a non-BMP character as a surrogate pair escape", _request('{"s": "\\ud83d\\ude00"}'), False, None),
    ("a backslash then u d800, as text", _request('{"s": "\\\\ud800"}'), False, None),
    ("brackets inside strings only", _request('{"s": "' + "[" * 70 + '"}'), False, None),
    ("an unpaired surrogate in a value", _request('{"s": "\\ud800"}'), False, rpc.INVALID_REQUEST),
    ("an unpaired surrogate in a key", _request('{"\\uDC00": 1}'), False, rpc.INVALID_REQUEST),
    ("nested deeper than allowed", _request('{"deep": ' + DEEP + "}"), False, rpc.PARSE_ERROR),
    ("64 opening brackets in all, the most it skips", _request('{"d": ' + "[" * 62 + "]" * 62 + "}"), True, None),
    ("65 opening brackets nested, one level too deep", _request('{"d": ' + "[" * 63 + "]" * 63 + "}"), False,
     rpc.PARSE_ERROR),
]


@pytest.mark.parametrize("what,text,plain,code", PLAINLY, ids=[p[0] for p in PLAINLY])
def test_the_walk_is_skipped_only_where_it_finds_nothing(what, text, plain, code):
    assert rpc.plainly_fine(text) is plain
    problem = rpc.json_problem(json.loads(text))
    assert (problem and problem[0]) == code
    if plain:
        assert problem is None
    if code is None:
        assert parse_request(text.encode()).method == "x"
    else:
        with pytest.raises(RpcError) as err:
            parse_request(text.encode())
        assert err.value.code == code
