"""The LP layer benchmark runs in quick mode and writes its tables (no timing is asserted)."""

from __future__ import annotations

from benchmarks import lp_layer


def test_lp_layer_benchmark_quick(tmp_path, capsys):
    lp_layer.main(["--quick", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "Newton steps to a relative gap" in out and "F LP unroll / reparam" in out
    text = (tmp_path / "lp_layer.md").read_text()
    assert "| planted m=12 n=3 |" in text and "reparam L_B [ms]" in text
    assert (tmp_path / "lp_layer.png").stat().st_size > 0
