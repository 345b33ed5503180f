from tests.kit.gateway import Gateway


async def test_chat_gets_salt(gw: Gateway) -> None:
    resp = await gw.chat(
        "acme", {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert resp.status == 200, await resp.text()
    assert gw.upstream.received[-1].json["cache_salt"].startswith("ns1.")
