"""``python -m train.demo``: its options are checked, and a short run writes what it prints."""

from __future__ import annotations

import json

import pytest

from train import demo


@pytest.mark.parametrize(
    "args, message",
    [
        (["--digit", "10"], "--digit must be 0..9, got 10"),
        (["--recall", "1"], "--recall must be in (0, 1), got 1.0"),
        (["--seeds", "0"], "--seeds and --epochs must be >= 1, got 0 and 30"),
    ],
)
def test_bad_options_are_refused(args, message, capsys):
    with pytest.raises(SystemExit) as e:
        demo.main(args)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_a_short_run_prints_the_table_and_writes_its_record(tmp_path, capsys):
    out = tmp_path / "demo"
    assert demo.main(["--digit", "3", "--seeds", "2", "--epochs", "2", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert (
        "| digit 3 against the rest, r = 0.95, 2 seeds | cross-entropy | precision at recall |"
        in text
    )
    record = json.loads((out / "demo.json").read_text())
    assert record["settings"]["digit"] == 3 and record["settings"]["seeds"] == [0, 1]
    for arm in demo.ARMS:
        (a, b) = record["results"][arm]
        assert 0 < a["precision"] <= 1 and a["recall"] > 0.5  # the val cut keeps most positives
        assert a != b  # the seeds differ
    assert record["results"]["cross-entropy"][0]["certified_recall"] is None


def test_the_same_seed_gives_the_same_figures():
    x, labels = demo.load_digits()
    y = (labels == 5).long()
    s = demo.Settings(digit=5, epochs=2)
    one, two = (demo.run_arm("precision at recall", x, y, 0, s) for _ in range(2))
    assert (one.precision, one.recall, one.certified_recall) == (
        two.precision,
        two.recall,
        two.certified_recall,
    )
