"""`bench`'s table and plot from a result (the lab test runs it against a deployed cluster)."""

import pytest

from llama_rpc_deploy.bench import plot, table

pytestmark = pytest.mark.xdist_group("matplotlib")  # one worker loads matplotlib and its fonts (half a second)
RESULT = {
    "prompt_tokens": 1081,
    "prompt_tokens_per_s": 900.5,
    "generation_tokens": 64,
    "generation_tokens_per_s": 26.0,
    "parallel": [
        {"streams": 1, "requests": 2, "failed": 0, "total_tokens_per_s": 25.5, "per_stream_tokens_per_s": 26.0},
        {"streams": 4, "requests": 8, "failed": 0, "total_tokens_per_s": 50.2, "per_stream_tokens_per_s": 13.1},
    ],
    "ceiling_tokens_per_s": 31.7,
    "single_over_ceiling": 0.82,
    "first_token_after_sleep_s": 45.0,
    "tensor_cache": {"10.0.0.20": (12 * 2**20, 64 * 2**30), "10.0.0.21": (-1, 2**29)},
}


def test_table_compares_with_the_ceiling():
    text = table(RESULT)
    assert "generation, 1 stream     26.0 tokens/s" in text
    assert "planner's ceiling        31.7 tokens/s  (one stream at 0.82x of it)" in text
    assert "      4             50.2         13.1        0" in text
    assert "first token after idle sleep: 45.0 s" in text
    assert "tensor cache on 10.0.0.20: 12.0 MiB of its 64 GiB limit" in text
    assert "tensor cache on 10.0.0.21: not readable" in text


def test_plot_is_a_png(tmp_path):
    out = tmp_path / "bench.png"
    plot(RESULT, out)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


@pytest.fixture
def saved(monkeypatch):
    """The figures plot() saves, as it saved them (the PNG is still written)."""
    from matplotlib.figure import Figure

    figures, savefig = [], Figure.savefig

    def record(fig, *args, **kwargs):
        figures.append(fig)
        return savefig(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", record)
    return figures


def _lines(fig):
    """(x, y) of every line on the figure's one plot."""
    [ax] = fig.axes
    return [([float(x) for x in line.get_xdata()], [float(y) for y in line.get_ydata()]) for line in ax.get_lines()]


def test_plot_draws_the_measured_points_and_the_ceiling(tmp_path, saved):
    out = tmp_path / "bench.png"
    plot(RESULT, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    [fig] = saved
    lines = _lines(fig)
    streams = [p["streams"] for p in RESULT["parallel"]]
    assert (streams, [p["total_tokens_per_s"] for p in RESULT["parallel"]]) in lines, "no line of total tokens/s"
    assert (streams, [p["per_stream_tokens_per_s"] for p in RESULT["parallel"]]) in lines, (
        "no line of tokens/s per stream"
    )
    # axhline: across the whole width (axes coordinates 0..1) at the ceiling
    assert ([0, 1], [31.7, 31.7]) in lines, f"no horizontal line at the ceiling (31.7 tokens/s) among {lines}"
    assert len(lines) == 3


def test_plot_without_a_ceiling_draws_no_ceiling_line(tmp_path, saved):
    plot(dict(RESULT, ceiling_tokens_per_s=None), tmp_path / "bench.png")
    [fig] = saved
    lines = _lines(fig)
    assert len(lines) == 2 and all(
        y == [p["total_tokens_per_s"] for p in RESULT["parallel"]]
        or y == [p["per_stream_tokens_per_s"] for p in RESULT["parallel"]]
        for _, y in lines
    )
