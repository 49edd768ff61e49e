"""Which torchrun attempts finish a job whose checkpoints have nothing left to train (issue 68, item 6)."""

from hetrain.jobs import torchrun_restart


def test_only_an_attempt_of_the_torchrun_job_that_trained_there_reads_as_its_restart(tmp_path, monkeypatch):
    monkeypatch.delenv(torchrun_restart.RUN_ID_ENV, raising=False)
    assert not torchrun_restart.restarts_this_job(str(tmp_path))  # not under torchrun: a user's resume
    monkeypatch.setenv(torchrun_restart.RUN_ID_ENV, "job-a")
    assert not torchrun_restart.restarts_this_job(str(tmp_path))  # no attempt of it trained here yet
    torchrun_restart.note_attempt(str(tmp_path))
    assert torchrun_restart.restarts_this_job(str(tmp_path))  # its restart
    monkeypatch.setenv(torchrun_restart.RUN_ID_ENV, "job-b")
    assert not torchrun_restart.restarts_this_job(str(tmp_path))  # a new torchrun command: refused as before
