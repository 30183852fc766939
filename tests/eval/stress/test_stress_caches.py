"""``dllm stress --caches``: KV-cache policies crossed with every setting, recorded in the result file,
checked before any decoding (bad specs, duplicates, settings the engine refuses) and before a resume."""

import json

import pytest

import dllm.engine
from dllm.cli import main
from dllm.eval.stress import sweep as stress_mod
from dllm.eval.stress.grid import build_grid, parse_caches
from dllm.eval.stress.sweep import StressConfig, StressStore, run_stress
from dllm.models.oracle import OracleLM

GRID = ("low_confidence:k=1,2",)


def test_a_sweep_over_two_caches_decodes_and_records_both(tmp_path, capsys, monkeypatch):
    real, seen = dllm.engine.generate, []

    def spy(*args, **kw):  # decode_and_score imports generate from dllm.engine at each call
        seen.append(kw.get("cache"))
        return real(*args, **kw)

    monkeypatch.setattr(dllm.engine, "generate", spy)
    out = tmp_path / "st"
    assert main(["stress", "--model", "tiny-llada", "--grid", "low_confidence:k=2", "--caches", "none,dual",
                 "--tasks", "copy", "--per-size", "1", "--threads", "1", "--out", str(out), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert {"none", "dual"} <= set(seen)  # each cache reached the engine
    data = json.loads((out / "stress.json").read_text())
    labels = ["low_confidence:k=2 cache=none", "low_confidence:k=2 cache=dual"]
    assert data["header"]["caches"] == ["none", "dual"] and data["header"]["settings"] == labels
    assert sorted(data["cells"]) == sorted(f"{label} | copy" for label in labels)
    rows = {r["label"]: r["cache"] for r in data["summary"]["settings"]}
    assert rows == dict(zip(labels, ["none", "dual"]))
    assert [(c["curve"], c["cache"]) for c in data["summary"]["curves"]] == [
        ("low_confidence cache=none", "none"), ("low_confidence cache=dual", "dual")]
    assert json.loads((out / "stress-summary.json").read_text())["caches"] == ["none", "dual"]
    assert "2 settings (caches none, dual)" in text and all(label in text for label in labels)


def test_without_caches_the_labels_and_curves_are_unchanged():
    default = build_grid(GRID, [0, 4])
    assert [s.label for s in default] == ["low_confidence:k=1", "low_confidence:k=2", "low_confidence:k=1 block=4",
                                          "low_confidence:k=2 block=4"]
    assert [s.curve for s in default] == ["low_confidence"] * 2 + ["low_confidence block=4"] * 2
    assert [s.label for s in build_grid(GRID, [0, 4], ["none"])] == [s.label for s in default]
    config = StressConfig("oracle", grid=GRID, tasks=("copy",), per_size=1)
    assert config.header()["settings"] == ["low_confidence:k=1", "low_confidence:k=2"]
    assert config.header()["caches"] == ["none"] and not config.cache_shown
    # one cache other than none is named: a sweep under dual alone must not look like an exact one
    assert [s.label for s in build_grid(GRID, [0], ["dual"])] == ["low_confidence:k=1 cache=dual",
                                                                   "low_confidence:k=2 cache=dual"]


def test_cache_specs_are_parsed_and_bad_ones_refused_naming_them(tmp_path, capsys, monkeypatch):
    assert parse_caches("none,dual:look_back=16") == ("none", "dual:look_back=16")
    assert parse_caches("none,(dual:look_back=16,look_ahead=16)") == ("none", "dual:look_back=16,look_ahead=16")
    assert parse_caches("dual:look_back=16;look_ahead=16") == ("dual:look_back=16,look_ahead=16",)
    with pytest.raises(ValueError, match="cache 'look_ahead=16' is no cache spec .* in parentheses"):
        parse_caches("none,dual:look_back=16,look_ahead=16")
    with pytest.raises(ValueError, match=r"caches list the cache 'dual' twice \('dual' and 'dual:refresh=None'\)"):
        parse_caches("dual,dual:refresh=None")
    with pytest.raises(ValueError, match="cache 'dual:bogus=1': .*Valid options: refresh"):
        parse_caches("dual:bogus=1")
    with pytest.raises(ValueError, match="grid entry 'low_confidence:cache=dual' sets cache=; give caches with "
                                         "--caches"):
        build_grid(["low_confidence:cache=dual"], [0])

    def no_load(*args, **kw):
        raise AssertionError("the model was loaded before the bad --caches was refused")

    monkeypatch.setattr(stress_mod, "load_stress_model", no_load)
    assert main(["stress", "--model", "oracle", "--grid", "low_confidence:k=1", "--caches", "none,duel",
                 "--tasks", "copy", "--per-size", "1", "--out", str(tmp_path / "st"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "cache 'duel': Unknown cache policy 'duel'. Valid cache policies:" in err
    assert {"none", "prefix", "dual"} <= set(err.split("Valid cache policies:")[1].replace(",", " ").split())
    assert not (tmp_path / "st").exists()


def test_a_setting_the_engine_refuses_fails_before_decoding(tmp_path, monkeypatch):
    def no_decode(*args, **kw):
        raise AssertionError("a cell was decoded before the refused setting was reported")

    monkeypatch.setattr(stress_mod, "decode_cell", no_decode)
    config = StressConfig("oracle", grid=GRID, tasks=("copy",), per_size=1, caches=("none", "dual"))
    with pytest.raises(ValueError, match=r"engine refuses settings of the grid on this model: low_confidence:k=1 "
                                         r"cache=dual, low_confidence:k=2 cache=dual: cache 'dual' reuses keys/values, "
                                         r"but OracleLM has no attention layers"):
        run_stress(OracleLM(), config, tmp_path / "stress.json", progress=False)
    assert not (tmp_path / "stress.json").exists()


def test_resume_with_other_caches_is_refused_naming_both(tmp_path, capsys):
    config = StressConfig("oracle", grid=("low_confidence:k=1",), tasks=("copy",), per_size=1)
    path = tmp_path / "st" / "stress.json"
    run_stress(OracleLM(), config, path, progress=False)
    other = StressConfig("oracle", grid=("low_confidence:k=1",), tasks=("copy",), per_size=1, caches=("none", "dual"))
    with pytest.raises(ValueError, match=r"different sweep: .*caches: file \['none'\], this run \['none', 'dual'\]"):
        StressStore.open(path, other.header(), resume=True)
    assert main(["stress", "--model", "oracle", "--grid", "low_confidence:k=1", "--caches", "prefix", "--tasks", "copy",
                 "--per-size", "1", "--out", str(tmp_path / "st"), "--no-progress", "--resume"]) == 2
    assert "caches: file ['none'], this run ['prefix']" in capsys.readouterr().err
    # a file from before --caches was swept without a KV cache: it resumes as `none`
    data = json.loads(path.read_text())
    del data["header"]["caches"]
    path.write_text(json.dumps(data))
    assert len(StressStore.open(path, config.header(), resume=True).cells) == 1
    with pytest.raises(ValueError, match=r"caches: file \['none'\], this run \['none', 'dual'\]"):
        StressStore.open(path, other.header(), resume=True)
