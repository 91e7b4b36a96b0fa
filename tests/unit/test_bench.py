"""`bench`'s table and plot from a result (the lab test runs it against a deployed cluster)."""
from llama_rpc_deploy.bench import plot, table

RESULT = {
    "prompt_tokens": 1081, "prompt_tokens_per_s": 900.5, "generation_tokens": 64, "generation_tokens_per_s": 26.0,
    "parallel": [{"streams": 1, "requests": 2, "failed": 0, "total_tokens_per_s": 25.5, "per_stream_tokens_per_s": 26.0},
                 {"streams": 4, "requests": 8, "failed": 0, "total_tokens_per_s": 50.2, "per_stream_tokens_per_s": 13.1}],
    "ceiling_tokens_per_s": 31.7, "single_over_ceiling": 0.82, "first_token_after_sleep_s": 45.0,
    "tensor_cache": {"10.0.0.20": (12 * 2 ** 20, 64 * 2 ** 30), "10.0.0.21": (-1, 2 ** 29)},
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
