"""Compressed Prague's copies and the communicator cache stay within ``--comm-memory-mb``: the launcher's
Group Generator and every worker size the cache alike, and a model that cannot fit is refused."""

import json

import torch

from hetrain.cli import main
from hetrain.config import RunConfig
from hetrain.data import build_model
from hetrain.jobs.run import fitted_protocol_options
from hetrain.protocols.comm_budget import MB
from hetrain.runtime.prague import fit_to_memory

BIG = ["--workload", "synthetic", "--model-params", "1000000"]  # a 4 MB model: 8 MB of copies per pair


def test_the_launcher_and_the_workers_size_the_cache_alike():
    for fields in (dict(compression="int8"), dict(compression="int8", outer_optimizer="nesterov"), dict()):
        config = RunConfig(protocol="prague", workload="synthetic", model_params=1_000_000, num_workers=3,
                           iterations=3, options={"comm_memory_mb": 20}, comm=fields).validate()
        model = build_model(config.workload, config.model_params, config.seed)
        worker = fit_to_memory(config.protocol_options(), model, config.comm_settings(), nccl=False)
        assert worker == fitted_protocol_options(config)
    assert fitted_protocol_options(config).communicator_cache == 60  # uncompressed on gloo: nothing held
    compressed = RunConfig(protocol="prague", workload="synthetic", model_params=1_000_000, comm={"compression": "int8"},
                           iterations=3, num_workers=3, options={"comm_memory_mb": 20}).validate()
    assert fitted_protocol_options(compressed).communicator_cache == 2  # 20 MB // (2 x 4 MB)


def test_a_model_too_large_for_the_budget_is_refused_before_anything_starts(no_warm_server, tmp_path, capsys):
    code = main(["train", "--protocol", "prague", "--compress", "int8", *BIG, "--comm-memory-mb", "4",
                 "--workers", "3", "--iterations", "3", "--no-progress", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and not (tmp_path / "run").exists()
    assert err.splitlines() == [err] and "more than --comm-memory-mb 4: raise it to 8 or more" in err


def test_compressed_prague_holds_no_more_copies_than_the_budget(processes, tmp_path):
    """3 workers in pairs: each is in 2 member sets (16 MB of copies), the budget fits one (12 MB). Were the
    workers' caches and the Group Generator's sized differently, the job would hang on a communicator
    one side evicted."""
    out = tmp_path / "run"
    assert main(["train", "--protocol", "prague", "--gg", "random", "--compress", "int8", *BIG,
                 "--comm-memory-mb", "12", "--workers", "3", "--iterations", "20", "--no-progress",
                 "--out", str(out)]) == 0
    workers = json.loads((out / "metrics.json").read_text())["workers"]
    assert all(w["comm_cache_entries"] == 1 for w in workers)
    assert all(0 < w["replica_bytes_peak"] <= 12 * MB for w in workers)
    assert sum(w["cache_evictions"] for w in workers) > 0
    assert torch.tensor([w["iterations"] for w in workers]).eq(20).all()
