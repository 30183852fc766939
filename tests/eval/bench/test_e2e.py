"""``dllm bench e2e``: what Ctrl-C keeps."""

import json

from dllm.eval.bench import e2e


def test_ctrl_c_writes_the_merged_pairs_to_the_file_it_names(tmp_path, monkeypatch, capsys):
    ours = e2e.specs("dual")[1]
    row = {"accuracy": 0.5, "tokens_per_second": 10.0}
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps({"ours": ours, "results": {"tiny-dream/pb-mini": {ours: row, e2e.FASTDLLM: row}},
                                   "verdicts": {"tiny-dream/pb-mini": {"dominates": False}}}))

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr("dllm.eval.compare.compare", interrupted)
    monkeypatch.setattr("dllm.scoring.exact_match.load_model", lambda name, device=None: name)
    out = tmp_path / "e2e"
    status = e2e.main(["--cache", "dual", "--pairs", "tiny-llada/pb-mini", "--merge", str(earlier),
                       "--out", str(out), "--no-progress"])
    assert status == 130
    assert f"saved in {out / 'e2e.json'}" in capsys.readouterr().out
    kept = json.loads((out / "e2e.json").read_text())  # the message's file holds the merged pair
    assert list(kept["verdicts"]) == ["tiny-dream/pb-mini"] and kept["n_per_task"] == {}  # not the cut pair's
