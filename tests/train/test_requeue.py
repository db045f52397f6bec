"""requeue_slurm_job never raises: outside SLURM it says so, and a missing or failing scontrol is
reported (the rank must still exit with the preemption status)."""
from rgpt_dist.train import preemption


def test_outside_slurm(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("SLURM_ARRAY_JOB_ID", raising=False)
    assert "not under SLURM" in preemption.requeue_slurm_job()


def test_array_task_id_and_missing_scontrol(monkeypatch, capsys):
    monkeypatch.setenv("SLURM_JOB_ID", "17")
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "12")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert preemption.requeue_slurm_job() == "requeue of job 12_3 failed; resubmit to resume"
    assert "scontrol requeue 12_3 failed" in capsys.readouterr().err
