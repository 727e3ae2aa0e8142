import pytest
import torch
from matplotlib.figure import Figure

from posenc.cli import main
from posenc.experiments.extrapolate import ExperimentConfig, attention_window, run, trained_models
from posenc.figures import encodings as figures
from posenc.figures.trained import attention_maps_figure, learned_table_figure

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "make, axes",
    [
        (figures.sinusoidal_heatmap, 2),  # image + colorbar
        (figures.similarity_figure, 3),
        (figures.rope_decay_figure, 2),
        (figures.rope_scalings_figure, 1),
        (figures.alibi_figure, 2),
        (figures.t5_buckets_figure, 1),
    ],
)
def test_figures_have_titled_labelled_axes(make, axes):
    figure = make()
    assert isinstance(figure, Figure)
    assert len(figure.axes) == axes
    for ax in figure.axes:
        if ax.get_label() == "<colorbar>":
            continue
        assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()


def test_similarity_numbers_are_the_formulas_not_the_seeds():
    sim = figures.cosine_similarity_matrix(51, 512)
    assert sim[0, 5].item() == pytest.approx(0.741, abs=1e-3)  # the seed prints 0.92
    assert sim[0, 40].item() == pytest.approx(0.535, abs=1e-3)  # the seed prints 0.12
    torch.testing.assert_close(sim, sim.t())


def test_rope_long_term_decay_for_constant_vectors():
    curve = figures.rope_decay_curve(torch.arange(0, 2001, 250), 10000.0, 128, constant=True)
    assert curve[0] == 1 and curve[-1] < 0.3


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    run(ExperimentConfig.from_preset("smoke", encodings="learned,alibi,t5,rope", steps=3), out, log=lambda *_: None)
    return out


def test_run_figures(run_dir):
    models = trained_models(run_dir)
    assert set(models) == {"learned", "alibi", "t5", "rope"}
    tokens = attention_window(run_dir)
    assert tokens.shape == (1, 16)
    maps = attention_maps_figure(models, tokens)
    assert len(maps.axes) == 4 * 2  # encodings × heads
    assert len(learned_table_figure(models["learned"].encoding.table).axes) == 4
    t5 = figures.t5_buckets_figure(learned=models["t5"].encoding.table.detach())
    assert len(t5.axes) == 2


def test_plot_command_writes_every_png(run_dir, tmp_path, capsys):
    assert main(["plot", "--out", str(tmp_path), "--ckpt", str(run_dir)]) == 0
    names = {"sinusoidal_heatmap.png", "sinusoidal_similarity.png", "rope_decay.png", "rope_scalings.png",
             "alibi.png", "t5_buckets.png", "learned_table.png", "attention_maps.png"}
    assert {p.name for p in tmp_path.iterdir()} == names
    for name in names:
        assert (tmp_path / name).read_bytes()[:8] == PNG


def test_plot_rejects_a_folder_without_checkpoints(tmp_path, capsys):
    (tmp_path / "config.json").write_text("{}")
    assert main(["plot", "--out", str(tmp_path / "f"), "--ckpt", str(tmp_path)]) == 2
    assert "no finished checkpoints" in capsys.readouterr().err


def test_a_row_keeps_its_colour_in_every_figure():
    """learned has no per-position losses past 1x, so the second figure leaves it out;
    the rows after it must not shift to another colour."""
    from posenc.figures.extrapolate import extrapolation_figure, position_loss_figure

    rows = [{"name": name, "bits_per_byte": {"8": 2.0, "16": 2.5},
             "position_bits": None if name == "learned" else {"bin_edges": [0, 8, 16], "bits": [2.0, 2.4]}}
            for name in ("none", "learned", "alibi", "rope")]
    results = {"rows": rows, "eval_lengths": [8, 16], "train_length": 8, "protocol": "non-overlapping windows"}

    def colours(figure):
        return {line.get_label(): line.get_color() for line in figure.axes[0].get_lines() if line.get_label()[0] != "_"}

    first, second = colours(extrapolation_figure(results)), colours(position_loss_figure(results))
    assert "learned" not in second
    assert all(first[name] == colour for name, colour in second.items())
    assert len(set(first.values())) == 4
