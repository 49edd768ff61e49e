"""A resume's refusals (issue 68, item 8): the topology counts by its edges (an edge file's content, not
its path), and every refusal is one line naming the flag that differs."""

import pytest

from hetrain.config import FLAG_NAMES, RunConfig
from hetrain.jobs import checkpoint
from hetrain.protocols.options import OptionError

TRIANGLE = "0 1\n1 2\n2 0\n"
BOTH_WAYS = "0 1\n1 2\n2 0\n1 0\n2 1\n0 2\n"


def _written(tmp_path, **settings) -> RunConfig:
    config = RunConfig(**{"protocol": "hop", **settings}, num_workers=3, checkpoint_dir=str(tmp_path / "ckpt"))
    checkpoint.start(config.checkpoint_dir, config, resumed=False)
    for rank in range(3):
        checkpoint.save_worker(config.checkpoint_dir, rank, {"model": {}, "protocol": {"iteration": 1}})
    return config


def _refusal(config: RunConfig) -> str | None:
    try:
        checkpoint.prepare(config.checkpoint_dir, config, resume=True)
    except OptionError as exc:  # an assertion, not pytest.raises: the mutant set expects assertion failures
        return exc.for_cli(FLAG_NAMES)
    return None


def test_an_edge_file_counts_by_its_content_not_its_path(tmp_path):
    edges, moved = tmp_path / "edges.txt", tmp_path / "moved.txt"
    edges.write_text(TRIANGLE)
    config = _written(tmp_path, options={"topology": str(edges)})
    moved.write_text("# the same graph\n2 0\n0 1\n1 2\n")  # another path, order and comment: the same edges
    assert _refusal(config.replace(options={"topology": str(moved)})) is None
    edges.write_text(BOTH_WAYS)  # the file edited between the run and its resume
    refusal = _refusal(config)
    assert refusal is not None and "--topology" in refusal, refusal
    assert "\n" not in refusal and "{" not in refusal, refusal


@pytest.mark.parametrize("change, flag", [
    ({"protocol": "dpsgd"}, "--protocol 'hop', this run has 'dpsgd'"),
    ({"options": {"topology": "complete"}}, "--topology 'ring', this run has 'complete'"),
    ({"options": {"staleness": 2}}, "--staleness 1, this run has 2"),
    ({"lr": 0.5}, "--lr 0.1, this run has 0.5"),
    ({"batch_size": 16}, "--batch-size 32, this run has 16"),
    ({"seed": 3}, "--seed 0, this run has 3"),
])
def test_every_refusal_is_one_line_naming_the_flag_that_differs(tmp_path, change, flag):
    config = _written(tmp_path)
    refusal = _refusal(config.replace(**change))
    assert refusal is not None and f"written with {flag};" in refusal, refusal
    assert "\n" not in refusal and "{" not in refusal, refusal  # no dump of the fingerprint's dicts
