"""Ray Serve replicas (``dllm.serve.ray_app``, extra ``dllm[ray]``): two CPU replicas of tiny-llada behind
one endpoint on 127.0.0.1, driven by the official ``openai`` client. Every greedy reply equals the
offline ``dllm.generate`` text, both replicas answer, streaming goes through Ray's proxy, and the page
is served."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

serve = pytest.importorskip("ray.serve", reason='Ray Serve is not installed (pip install "dllm[ray]")')
openai = pytest.importorskip("openai")

import ray  # noqa: E402

import dllm  # noqa: E402
from dllm import tasks as T  # noqa: E402
from dllm.models.parallel.group import free_port  # noqa: E402
from dllm.serve.ray_app import REPLICA_HEADER, DiffusionReplica, application, run  # noqa: E402

pytestmark = pytest.mark.slow  # starts Ray and two replica processes (~1 min on 2 cores)

MODEL = "tiny-llada"
SETTINGS = ({"sampler": "low_confidence", "cache": "none"}, {"sampler": "threshold", "cache": "dual"})




@pytest.fixture(scope="module")
def endpoint():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=80 * 1024 ** 2)
    try:
        port = free_port()
        run(application(DiffusionReplica(MODEL), replicas=2, num_cpus=1, threads=1), host="127.0.0.1", port=port,
            blocking=False)
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


def requests(n: int):
    out = []
    for i, name in enumerate(("sort", "reverse", "copy", "add_lsb") * n):
        ex = T.test_split(name, n=n)[i // 4]
        out.append((" ".join(T.prompt_words(ex)), T.answer_length(name, ex.size), SETTINGS[i % 2]))
        if len(out) == n:
            return out
    return out


def test_two_replicas_answer_exactly_as_offline(endpoint):
    client = openai.OpenAI(base_url=endpoint + "/v1", api_key="unused", max_retries=0, timeout=120)
    load = requests(16)

    def ask(req):
        prompt, n, settings = req
        raw = client.completions.with_raw_response.create(model=MODEL, prompt=prompt, max_tokens=n, temperature=0,
                                                          extra_body=settings)
        return raw.parse().choices[0].text, raw.headers.get(REPLICA_HEADER)

    with ThreadPoolExecutor(16) as pool:
        replies = list(pool.map(ask, load))
    model = dllm.load(MODEL)
    for (prompt, n, settings), (text, _) in zip(load, replies):
        assert text == dllm.generate(model, prompt, gen_length=n, **settings).texts[0], (prompt, settings)
    replicas = {tag for _, tag in replies}
    assert None not in replicas and len(replicas) == 2, replicas  # 16 at once: Ray routes to both


def test_streaming_and_the_page_through_the_proxy(endpoint):
    import urllib.request

    client = openai.OpenAI(base_url=endpoint + "/v1", api_key="unused", max_retries=0, timeout=120)
    prompt = "[BOS] sort D A C B [SEP]"
    whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0).choices[0].text
    pieces = [c.choices[0].text for c in client.completions.create(model=MODEL, prompt=prompt, max_tokens=6,
                                                                   temperature=0, stream=True) if c.choices]
    assert "".join(pieces) == whole and whole
    with urllib.request.urlopen(endpoint + "/", timeout=30) as page:
        assert page.status == 200 and b"/static/page.js" in page.read()
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_bad_replica_counts_are_refused():
    with pytest.raises(ValueError, match="replicas must be a positive integer, got 0"):
        application(DiffusionReplica(MODEL), replicas=0)
