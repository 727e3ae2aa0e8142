import json

from posenc.bench import bench_attention
from posenc.cli import main


def test_bench_rows_are_ratios_to_eager_in_the_same_run():
    rows = bench_attention("cpu", lengths=(32,), heads=2, head_dim=8, repeats=1)
    by_key = {(r["encoding"], r["backend"]): r for r in rows}
    assert by_key[("rope", "eager")]["vs_eager"] == 1.0
    assert ("shaw", "sdpa") not in by_key and ("transformer_xl", "sdpa") in by_key
    for r in rows:
        assert r["ms"] > 0 and r["vs_eager"] > 0


def test_bench_cli_writes_json(tmp_path, capsys):
    assert main(["bench", "--lengths", "16", "--repeats", "1", "--json", str(tmp_path / "b.json")]) == 0
    assert "time / eager" in capsys.readouterr().out
    assert json.loads((tmp_path / "b.json").read_text())["rows"]
