"""``start_local_ray``: the cluster a pool starts for itself runs its actors at niceness 0 and keeps
Ray's INFO lines off the console (a fresh process: Ray reads the niceness when it starts)."""

import subprocess
import sys

SCRIPT = """
import os, ray
from marsrl.rollout.pool import start_local_ray
start_local_ray()

@ray.remote(num_cpus=0)
def niceness():
    return os.nice(0)

print("actor niceness", ray.get(niceness.remote()), flush=True)
ray.shutdown()
"""


def test_local_cluster_actors_at_niceness_zero_and_a_quiet_start():
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("RAY_")}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "actor niceness 0" in done.stdout, done.stdout
    console = done.stdout + done.stderr
    assert "Started a local Ray instance" not in console, console[-2000:]
