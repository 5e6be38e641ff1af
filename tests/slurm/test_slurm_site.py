"""SlurmSite's readers of Slurm's text formats (no cluster needed)."""

import pytest

from gpulab.backend.slurm_site import SlurmError, SlurmSite, parse_gres, parse_scontrol


@pytest.mark.parametrize(
    "text, counts, gpu_type",
    [
        ("gpu:2,shard:8", {"gpu": 2, "shard": 8}, None),
        ("gpu:a100:2(S:0-1),shard:8", {"gpu": 2, "shard": 8}, "a100"),
        ("gpu:tesla:4(S:0),mps:400", {"gpu": 4, "mps": 400}, "tesla"),
        ("(null)", {}, None),
        ("", {}, None),
    ],
)
def test_gres_strings_become_counts_and_the_gpu_type(text, counts, gpu_type):
    assert parse_gres(text) == (counts, gpu_type)


def test_scontrol_show_job_pairs():
    text = (
        "JobId=7 JobName=gpulab-abc\n   UserId=gpulab-alice(1001) GroupId=gpulab-alice(1001)\n"
        "   JobState=CANCELLED Reason=None Dependency=(null)\n   NodeList=sb1n[0-1]\n"
        "   Comment=gpulab:abc ExitCode=0:15\n"
    )
    info = parse_scontrol(text)
    assert info["JobId"] == "7" and info["JobState"] == "CANCELLED"
    assert info["UserId"] == "gpulab-alice(1001)" and info["NodeList"] == "sb1n[0-1]"
    assert info["Comment"] == "gpulab:abc"


def test_env_exports_the_conf_and_the_bin_dir():
    site = SlurmSite(slurm_conf="/srv/s/etc/slurm.conf", bin_dir="/opt/slurm/bin")
    env = site.env()
    assert env["SLURM_CONF"] == "/srv/s/etc/slurm.conf"
    assert env["PATH"].startswith("/opt/slurm/bin:")
    assert site.command("squeue") == "/opt/slurm/bin/squeue"


async def test_a_missing_command_says_what_to_install():
    site = SlurmSite(bin_dir="/nonexistent/slurm/bin")
    with pytest.raises(SlurmError, match="apt-get install slurm-wlm"):
        await site.run(["squeue"])


async def test_an_owners_comment_and_name_cannot_move_slurms_own_fields():
    """A job's owner may set its Comment and JobName (``scontrol update``); one with
    "|" in it made the squeue line unreadable, and the fallback took a JobState and
    NodeList written inside the name."""
    site = SlurmSite()
    line = "7|RUNNING|sb1n0|gpulab-alice|gres/gpu:1|None|a|b|x JobState=COMPLETED NodeList=evil\n"

    async def run(argv, **kw):
        assert argv[0] == "squeue", argv  # never the scontrol fallback
        return line

    site.run = run
    info = await site.job("7")
    assert (info["state"], info["nodes"], info["user"]) == ("RUNNING", "sb1n0", "gpulab-alice")
    assert info["name"] == "x JobState=COMPLETED NodeList=evil"
