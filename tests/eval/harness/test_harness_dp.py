"""The lm-eval model ``dllm`` data parallel on two CPU processes gives the single-process numbers, and
each process decodes its own share of the requests.

``accelerate launch --multi_gpu --num_processes 2`` starts two processes through torchrun also without
a GPU (``--cpu --num_processes 2`` starts one: accelerate's multi-CPU launch needs mpirun and a
hostfile); the model then asks accelerate for a CPU (gloo) process group.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

pytest.importorskip("lm_eval")

from dllm import tasks as T  # noqa: E402
from dllm.scoring.exact_match import decode_and_score, eval_examples  # noqa: E402
from dllm.eval.harness.tasks import DATA_ENV, lm_task_name, write_task_files  # noqa: E402
from dllm.models import load  # noqa: E402

TASKS = ("copy", "sort_num", "pick_pair", "shuffle_2tok")
PER_SIZE = 2

# Run by every process; lm-eval's own tasks are not indexed (seconds per process, not ours to test).
SCRIPT = """
import json, sys
import torch
torch.set_num_threads(1)
import lm_eval
from dllm.eval.harness import DllmLM, task_manager

class Counting(DllmLM):
    requests = 0
    def generate_until(self, requests, disable_tqdm=False):
        self.requests += len(requests)
        return super().generate_until(requests, disable_tqdm)

lm = Counting(pretrained="tiny-llada", dtype="float32", sampler="fast", batch_size=4)
res = lm_eval.simple_evaluate(model=lm, tasks=sys.argv[2].split(","), task_manager=task_manager(False))
out = {"rank": lm.rank, "world_size": lm.world_size, "requests": lm.requests}
if res is not None:
    out["results"] = {k: v["exact_match,none"] for k, v in res["results"].items()}
with open(f"{sys.argv[1]}/rank{lm.rank}.json", "w") as f:
    json.dump(out, f)
"""


@pytest.mark.slow
def test_two_processes_give_the_single_process_numbers(tmp_path):
    accelerate = shutil.which("accelerate", path=os.path.dirname(sys.executable)) or shutil.which("accelerate")
    if accelerate is None:
        pytest.skip("the accelerate command is not installed")
    write_task_files(tmp_path / "data", per_size=PER_SIZE, tasks=TASKS)
    (tmp_path / "run.py").write_text(SCRIPT)
    env = {**os.environ, DATA_ENV: str(tmp_path / "data"), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",  # two CPU processes, on a GPU machine too
           "HF_DATASETS_CACHE": os.path.join(tempfile.gettempdir(), "dllm-test-datasets-cache")}
    cmd = [accelerate, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision",
           "no", "--dynamo_backend", "no", "--main_process_port", "0", str(tmp_path / "run.py"), str(tmp_path),
           ",".join(lm_task_name(t) for t in TASKS)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    # one launch: the abort at exit that made it flaky (a Gloo worker releasing lm-eval's last gather
    # during finalization) is closed by dllm.models.parallel.objects (tests/models/parallel/test_objects.py)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [(r["rank"], r["world_size"]) for r in ranks] == [(0, 2), (1, 2)]
    total = PER_SIZE * sum(len(T.get_task(t).default_sizes) for t in TASKS)
    assert all(0 < r["requests"] < total for r in ranks)  # each process decoded a share (lm-eval pads shares)
    model = load("tiny-llada", dtype="float32")
    want = decode_and_score(model, eval_examples(TASKS, per_size=PER_SIZE), "fast").accuracy
    assert ranks[0]["results"] == {lm_task_name(t): want[t] for t in TASKS}
    assert "results" not in ranks[1]

