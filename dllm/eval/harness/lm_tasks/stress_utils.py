"""lm-eval glue of the dllm stress tasks, loaded by the YAMLs beside it (``!function stress_utils.*``).

``StressTask`` is lm-eval's ``ConfigurableTask`` with two changes: its ``data_files`` are found in the
stress-task data directory (``dllm.eval.harness.tasks.resolve_data_files``: a missing file names the
path and the command that writes it), and each request asks for exactly the document's answer length
(``max_gen_toks = answer_length``). ``process_results`` scores with the task's exact scorer.
"""

from lm_eval.api.task import ConfigurableTask

from dllm.eval.harness.tasks import resolve_data_files, score_region


class StressTask(ConfigurableTask):
    def __init__(self, config=None, **kwargs):
        # the YAML's "class" key selected this class; it is no TaskConfig field
        super().__init__(config={k: v for k, v in (config or {}).items() if k != "class"}, **kwargs)

    def download(self, dataset_kwargs=None, **kwargs):
        super().download(resolve_data_files(dataset_kwargs, self.config.task), **kwargs)

    def construct_requests(self, doc, ctx, **kwargs):
        requests = super().construct_requests(doc, ctx, **kwargs)
        for inst in requests if isinstance(requests, list) else [requests]:
            inst.arguments[1]["max_gen_toks"] = int(doc["answer_length"])  # a fresh copy per request
        return requests


def process_results(doc, results):
    return {"exact_match": float(score_region(doc, results[0]))}
